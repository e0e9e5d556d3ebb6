"""The task's modules (``src/mnist_ddp``) use no private API of a library: only the engine's
``ddp_engine.core.compat`` may, where a library's release that changes one degrades instead of
failing. The task does not import compat, reads no private attribute, and its classes touch no
private name of a library base class. The engine's own modules are fenced by its tests
(engine/tests/core/test_compat.py), with the same scan (``private_uses``).
"""

from pathlib import Path

from private_uses import compat_imports, defined_classes, library_private_names_touched, package_private_uses

import mnist_ddp

PACKAGE = Path(mnist_ddp.__file__).parent


def test_the_tasks_modules_use_no_private_api_through_compat():
    # The classes a cloner copies (the LightningModule, DataModules, figures) reach the engine's
    # public modules only: compat is the engine's own.
    found = compat_imports(PACKAGE)
    assert found == [], f"the project imports ddp_engine.core.compat: {found}"


def test_the_tasks_modules_use_no_private_api():
    found = package_private_uses(PACKAGE)
    assert PACKAGE.is_dir()
    assert not found, "private APIs used by the task (go through ddp_engine.api):\n" + "\n".join(found)


def test_the_tasks_subclasses_of_library_classes_touch_no_private_name_of_theirs():
    found = library_private_names_touched(defined_classes([mnist_ddp]), own={"ddp_engine", "mnist_ddp"})
    assert not found, (
        "private names of a library's base class, used or overridden by a subclass (go through "
        "ddp_engine/core/compat.py):\n" + "\n".join(found)
    )
