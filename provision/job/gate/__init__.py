"""The fabric gate: before a multi-node job starts, prove that the network between the nodes
delivers what it should, or stop with the node(s) to blame and the likely fix.

    step.py      the lifecycle's gate step: in the job's own processes, or a run of its own
    injob.py     the gate inside the job's launch (remote.pyz injob before the script)
    separate.py  the gate as a torchrun of its own before the job; `check --fabric`
    judge.py     the verdict from the nodes' output (pure), the table, FabricGateError
    words.py     the verdict in words: rows, problems, likely fixes
    fabric.py    which network NCCL chose (its INFO lines) and the fix when it is not the
                 expected one
"""
