"""Type test for the mypy plugin `twinkle_core.tools.mypy_plugin` (run by the lint session:
`mypy --config-file tests/typing/mypy.ini tests/typing`).

Lines that must type-check have no comment; lines that must be rejected carry
`# type: ignore[<code>]`, and `warn_unused_ignores` turns an error that went missing into a
failure too. So a plugin that stops adding `remote_group=` fails on the good lines, and one that
accepts anything fails on the bad ones.
"""

from twinkle_core import DeviceMesh, remote_class


@remote_class()
class Trainer:
    """Declares `device_mesh` (twinkle fills it) and a required `lr`."""

    def __init__(self, lr: float, device_mesh: DeviceMesh) -> None:
        self.lr = lr
        self.mesh = device_mesh


@remote_class(execute="first")
class Plain:
    """No `__init__` of its own."""


class Sub(Trainer):
    """Inherits the remote class's constructor."""


class NotRemote:
    def __init__(self, lr: float) -> None:
        self.lr = lr


mesh = DeviceMesh.from_sizes(dp_size=2)

# Accepted: twinkle's keywords, and a declared device_mesh left to twinkle.
Trainer(0.1, remote_group="model")
Trainer(0.1, remote_group="model", device_mesh=mesh)
Trainer(lr=0.1)
Plain(remote_group="rollout")
Sub(0.2, remote_group="model")
annotated: Trainer = Trainer(0.1)
assert isinstance(annotated, Trainer)

# Rejected: the user's own parameters are still checked, and so are twinkle's.
Trainer("fast", remote_group="model")  # type: ignore[arg-type]
Trainer(0.1, remote_group=3)  # type: ignore[arg-type]
Trainer(0.1, device_mesh="2x2")  # type: ignore[arg-type]
Trainer(0.1, remote_grup="model")  # type: ignore[call-arg]
NotRemote(0.1, remote_group="model")  # type: ignore[call-arg]
