"""The engine tests' runs of their test task, the regression (``sensor_task``): its data sets and
the deterministic configuration of the equivalence and resume checks, which the fixtures in
conftest.py train once per session and the tests share.

Test modules import them with ``from runs import ...`` (engine/tests is on pytest's ``pythonpath``).
"""

from pathlib import Path

from sensor_task.regression import make_sensor_windows

#: The training command of the test task.
TRAIN = "sensor_task.train"

# The deterministic configuration: dropout off, SGD with momentum and a one-cycle schedule
# (optimizer and schedule state that resuming must restore), 2 epochs of 21 global batches of 48
# over 1,008 training windows, which divide by 1, 2, 3 and 4 processes alike. Validation 191 and
# test 301 windows divide by neither 2 nor 3, so that counting a window twice changes the MSE.
TRAIN_SIZE, VAL_SIZE, TEST_SIZE, GLOBAL_BATCH, LR = 1008, 191, 301, 48, 0.005

DETERMINISTIC = (
    "trainer.accelerator=cpu", "trainer.max_epochs=2", f"data.global_batch_size={GLOBAL_BATCH}",
    "model.net.dropout=0", "model.optimizer._target_=torch.optim.SGD", f"model.optimizer.lr={LR}",
    "+model.optimizer.momentum=0.9",
    f"model.scheduler={{_target_:torch.optim.lr_scheduler.OneCycleLR,_partial_:true,max_lr:{LR}}}",
    "+callbacks.recorder._target_=probes.SampleRecorder", "+callbacks.recorder.out_dir=${paths.output_dir}/samples",
)  # fmt: skip


def deterministic_windows(folder: Path) -> Path:
    """The windows of the deterministic runs: TRAIN_SIZE, VAL_SIZE and TEST_SIZE of them."""
    return make_sensor_windows(folder / "windows.npz", n_train=TRAIN_SIZE, n_val=VAL_SIZE, n_test=TEST_SIZE)
