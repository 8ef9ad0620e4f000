"""The objects room: big envelope bodies by verified reference (``payloads``), keyed and bound to
their message (``keys``), in S3 (``s3``) or, in the embedded mode, a directory (``directory``)."""
