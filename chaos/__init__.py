"""The chaos run: a topology of Brains and Hands pools on real services, a workload of agent
turns whose tools call a counting external service, and faults injected from a seed
(``python -m chaos run``). See docs/chaos/README.md."""
