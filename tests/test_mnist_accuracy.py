"""The default recipe on real MNIST, two DDP processes over gloo: at least 99.0% test accuracy.

This is the slowest test (about two minutes on two CPU cores): three epochs of the default
recipe, exactly what ``make train`` runs, read back from TensorBoard's event files.
"""

from conftest import read_scalars, run_cli


def test_default_recipe_reaches_99_percent_on_the_official_test_set(mnist_data_dir, tmp_path):
    result = run_cli(
        f"data.data_dir={mnist_data_dir}", "trainer.accelerator=cpu", "trainer.devices=2", log_dir=tmp_path
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    (run,) = (tmp_path / "runs").iterdir()
    scalars = read_scalars(run / "tensorboard")
    (test_acc,) = scalars["test/acc"]
    print(f"test/acc={test_acc:.4f} val/acc per epoch={scalars['val/acc']}")
    assert test_acc >= 0.99
