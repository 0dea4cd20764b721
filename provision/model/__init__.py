"""The model layer: plain data and the rules that check it; imports no other layer.

    spec.py        ClusterSpec (where) and JobSpec (what), validated before anything runs
    inventory.py   one YAML per cluster (atomic, locked): the typed spec, resources, nodes
    plan.py        Plan: what `up` would create and cost (providers subclass it)
    jobstore.py    job records and copied logs, kept after `down`
    registry.py    providers and launchers by name (declarations; implementations load lazily)
    errors.py      the one error tree (exit codes, hints)
    nodetext.py    a node's text: the one line splitter and the one escaping for people
    nodejson.py    a node's JSON: typed, bounded models; Unreadable
    keys.py, gate_record.py, base.py, assets.py, render.py
"""
