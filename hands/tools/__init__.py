"""The tools room: how tools are declared (``declare``: the ``@tool`` decorator and the context a
body gets) and found again by a pool (``registry``)."""
