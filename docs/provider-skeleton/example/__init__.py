"""`example` provider: the smallest complete provider, as a template for a new one.

Copy this folder to provision/cluster/providers/<name>/, rename, and add ONE line to
provision/model/registry.py REGISTRY. Nothing else in the tool needs editing: the spec
gets an `<name>:` section typed by `options`, `up`/`run` get the `flags`, `gc` gets the flags
marked gc=True, and the pipeline rolls back through `destroy`.

This one "creates" nothing: its nodes are addresses listed in its options (like a tiny ssh
provider), which is enough for tests/test_provider_skeleton.py to drive it end to end.
"""

from provision.model.registry import Flag, ProviderInfo

INFO = ProviderInfo(
    name="example",
    summary="template for new providers (nodes listed in its options)",
    options="example.options:ExampleOptions",
    implementation="example.provider:ExampleProvider",
    costs_money=False,
    flags=(
        Flag("--example-hosts", "hosts", help="comma-separated addresses"),
        Flag("--example-user", "user", help="login user"),
    ),
    # connector="example.transport:connector",  # only if nodes are not reached over SSH
)
