"""The sandbox's pure rules: its lifecycle state table, identities and markers, who may use a
binding, and the operation log a command leaves inside the sandbox. No I/O."""
