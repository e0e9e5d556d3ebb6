"""Kubernetes through Kubeflow Trainer (``launcher=kubeflow``): the TrainJob manifest a command writes,
checked against Kubeflow Trainer's own API models; its refusals; its submission; and the manifest's
own container command run as the pods of a 2-node TrainJob would run it.

A Kubernetes cluster cannot exist here. Two "pods" are the manifest's command and environment run
twice on localhost with the ``PET_*`` variables Kubeflow Trainer's torch runtime gives the pods of a
2-node TrainJob (``pkg/runtime/framework/plugins/torch/torch.go``); torchrun, gloo and the run are
real. Submission is tested through its refusal without a cluster (real: no kube config here) and,
with the cluster mocked (the kubernetes client's config loading and API call), for what it sends.
"""

import json
import os
import signal
import time
from unittest import mock

import pytest
import torch
import yaml
from harness import max_difference, params, process_tree, processes_mentioning, run_cli, trainjob_pods
from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob
from runs import DETERMINISTIC, TRAIN

from ddp_engine.config.checks import check_output_dir
from ddp_engine.config.command_line import check_command_line
from ddp_engine.config.compose import composed_jobs
from ddp_engine.config.early_checks import check_jobs_early
from ddp_engine.core.errors import ConfigValueError, UsageError
from ddp_engine.launch.kubeflow import submit

# The parameters of a 2-node x 1 run and a 1-node x 2 run (the command's own 2 processes) differ in
# how each process's threads sum (a lone process per node gets every core): float rounding, as
# between distributed/test_ddp.py's layouts.
PARAM_ATOL = 1e-6
# 2 epochs of 21 optimizer steps (runs.DETERMINISTIC); last.ckpt every 5 steps.
STEPS, CHECKPOINT_EVERY = 42, 5


def kubeflow_overrides(volume, *more: str) -> tuple[str, ...]:
    return ("launcher=kubeflow", "launcher.kubeflow.image=registry.example.org/team/sensor:1",
            "launcher.kubeflow.volume=team-runs", f"launcher.kubeflow.mount_path={volume}", *more)  # fmt: skip


def refusal(*overrides: str) -> str:
    """The one line a command line with ``overrides`` is refused with."""
    with pytest.raises(UsageError) as error:
        check_command_line("config", list(overrides))
    assert "\n" not in str(error.value)
    return str(error.value)


@pytest.mark.parametrize("key", ["image", "volume"])
def test_a_trainjob_without_image_or_volume_is_refused_naming_the_key(sensor_data, key):
    message = refusal(*sensor_data, *kubeflow_overrides("/mnt/runs", f"launcher.kubeflow.{key}=null"))
    assert message.startswith(f"launcher.kubeflow.{key} is not set: launcher=kubeflow needs ")


def test_a_sweep_of_trainjobs_is_refused(sensor_data):
    """One TrainJob per command: a sweep's jobs would share its name, and so its run directory."""
    message = refusal("-m", *sensor_data, *kubeflow_overrides("/mnt/runs", "trainer.devices=2"), "seed=1,2")
    assert message.startswith("launcher=kubeflow writes the TrainJob of one run: run each job of the sweep as ")


def test_fewer_gpus_per_pod_than_processes_is_refused(sensor_data):
    """Each of a pod's trainer.devices processes drives one GPU."""
    message = refusal(*sensor_data, *kubeflow_overrides("/mnt/runs", "trainer.accelerator=gpu", "trainer.devices=4",
                                                        "launcher.kubeflow.gpus_per_node=2"))  # fmt: skip
    assert message == (
        "launcher.kubeflow.gpus_per_node=2 is fewer than trainer.devices=4, the processes of each pod, one per GPU: "
        "set launcher.kubeflow.gpus_per_node=4 (or leave it null: trainer.devices)."
    )


def test_a_plan_of_a_trainjobs_layout_plans_it_here(sensor_data):
    """``plan`` with the TrainJob's command line (no image given) checks the layout, writes no TrainJob;
    and a plan is of one layout: -m refused."""
    layout = ("trainer.accelerator=gpu", "trainer.num_nodes=2", "trainer.devices=4", "strategy=ddp_nccl")
    plan = [*sensor_data, *kubeflow_overrides("/mnt/runs", "launcher.kubeflow.image=null", *layout)]
    jobs = composed_jobs("plan", plan)
    check_jobs_early("plan", jobs)  # no refusal of the unset image: the plan runs here
    with pytest.raises(ConfigValueError, match=r"^A plan is of one layout: run python -m <package>.plan once per"):
        check_jobs_early("plan", composed_jobs("plan", ["-m", *plan, "seed=1,2"]))


def test_a_pod_meeting_a_completed_run_of_its_name_refuses_it_and_one_of_a_stopped_run_resumes(tmp_path, monkeypatch):
    """What global rank 0 of a TrainJob's pod checks in its run directory (the pod's variable set here):
    the same name applied again after its run completed is refused; a run that stopped is resumed."""
    monkeypatch.setenv("DDP_ENGINE_TRAINJOB", "sensor-c")
    run_dir = tmp_path / "trainjob-sensor-c"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"")
    (run_dir / "metrics.json").write_text(json.dumps({"status": "completed"}))
    with pytest.raises(ConfigValueError) as error:
        check_output_dir(run_dir, resume=False)
    assert str(error.value) == (
        f"TrainJob sensor-c: its run {run_dir} completed, so there is nothing to resume. Submit a new run under "
        "another name (launcher.kubeflow.name=<new name>)."
    )
    (run_dir / "metrics.json").write_text(json.dumps({"status": "stopped", "signal": "SIGTERM"}))
    assert check_output_dir(run_dir, resume=False) is None


def test_submitting_without_a_cluster_is_refused_before_anything_is_written(sensor_data, tmp_path, monkeypatch):
    """Real: no cluster is configured here (no kube config, not in a pod)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    overrides = [*sensor_data, *kubeflow_overrides("/mnt/runs", "launcher.kubeflow.submit=true", "trainer.devices=2"),
                 f"paths.log_dir={tmp_path / 'logs'}"]  # fmt: skip
    assert refusal(*overrides) == (
        "launcher.kubeflow.submit=true: no Kubernetes cluster to submit to (Invalid kube-config file. No "
        "configuration found.). Set KUBECONFIG or the kube context, or leave launcher.kubeflow.submit=false to "
        "write the manifest only."
    )
    assert not (tmp_path / "logs").exists()


@pytest.mark.processes
def test_the_manifest_is_a_trainjob_of_the_composed_run(sensor_data, tmp_path):
    """The command writes a TrainJob that Kubeflow Trainer's API models read back unchanged, with the
    run's layout, image, volume and command. 8 GPUs on 2 nodes: this machine has none, and the check
    counts the cluster's, not its own."""
    # The run's own overrides, one with an interpolation that resolves in the pods, for their run.
    run = (*sensor_data, "trainer.accelerator=gpu", "trainer.num_nodes=2", "trainer.devices=4", "strategy=ddp_nccl",
           "+callbacks.ranks._target_=probes.RankRecorder",
           "+callbacks.ranks.out_dir=${paths.output_dir}/ranks")  # fmt: skip
    overrides = kubeflow_overrides(
        "/mnt/runs", "launcher.kubeflow.name=sensor-a", "launcher.kubeflow.cpu_per_node=8", *run
    )
    result = run_cli(TRAIN, *overrides, log_dir=tmp_path / "logs")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (manifest_path,) = (tmp_path / "logs" / "runs").glob("*/trainjob.yaml")
    assert f"Submit it with: kubectl apply -f {manifest_path}" in result.stdout
    manifest = yaml.safe_load(manifest_path.read_text())
    # Every key is one of the API's, of the API's type: the models read it back without a loss.
    assert TrainerV1alpha1TrainJob.from_dict(manifest).to_dict() == manifest
    assert (manifest["apiVersion"], manifest["kind"], manifest["metadata"]) == (
        "trainer.kubeflow.org/v1alpha1", "TrainJob", {"name": "sensor-a"}
    )  # fmt: skip
    spec = manifest["spec"]
    assert spec["runtimeRef"] == {"name": "torch-distributed"}
    resources = {"cpu": "8", "nvidia.com/gpu": "4"}
    assert spec["trainer"] == {
        "image": "registry.example.org/team/sensor:1",
        "numNodes": 2,
        "numProcPerNode": 4,
        "command": ["torchrun"],
        "args": ["-m", TRAIN, *run, "paths.log_dir=/mnt/runs/logs"],  # as typed, the manifest's own left out
        "env": [{"name": "DDP_ENGINE_TRAINJOB", "value": "sensor-a"}],
        "resourcesPerNode": {"requests": resources, "limits": resources},
    }
    (patch,) = spec["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = node["template"]["spec"]["template"]["spec"]
    assert node["name"] == "node" and pod["containers"] == [
        {"name": "node", "volumeMounts": [{"name": "runs", "mountPath": "/mnt/runs"}]}
    ]  # fmt: skip
    assert pod["volumes"] == [{"name": "runs", "persistentVolumeClaim": {"claimName": "team-runs"}}]


def test_submit_creates_the_manifest_as_it_is_in_the_namespace(tmp_path):
    """Mocked: the cluster (the kubernetes client's config loading, the SDK's check of the control
    plane, the API call). What the SDK's backend sends is the manifest, unchanged, as a TrainJob of
    trainer.kubeflow.org/v1alpha1; a refusal of the API is one line naming the manifest."""
    manifest = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "sensor-a"},
                "spec": {"runtimeRef": {"name": "torch-distributed"}}}  # fmt: skip
    backend = "kubeflow.trainer.backends.kubernetes.backend.KubernetesBackend.verify_backend"
    create = "kubernetes.client.CustomObjectsApi.create_namespaced_custom_object"
    with (mock.patch("kubernetes.config.load_kube_config"), mock.patch(backend),
          mock.patch(create) as created):  # fmt: skip
        assert submit(manifest, "team", tmp_path / "trainjob.yaml") == "team"
        created.assert_called_once_with("trainer.kubeflow.org", "v1alpha1", "team", "trainjobs", manifest)
        created.side_effect = RuntimeError("(409)\nReason: Conflict\nHTTP response body: ...")
        with pytest.raises(UsageError) as error:
            submit(manifest, "team", tmp_path / "trainjob.yaml")
    assert str(error.value) == (
        "launcher.kubeflow.submit=true: the cluster refused TrainJob sensor-a ((409)). The manifest is written: "
        f"kubectl apply -f {tmp_path / 'trainjob.yaml'} submits it once that is fixed."
    )


@pytest.mark.processes
def test_two_pods_train_like_two_processes_and_a_killed_pod_resumes_in_place(deterministic_run, deterministic_data,
                                                                             tmp_path):  # fmt: skip
    """The manifest's own container command, run as the 2 pods of a 2-node TrainJob with one process
    each: one pod SIGKILLed mid-run takes the other down (no process left), both run again resume the
    run in its directory on the volume from last.ckpt, and the run ends where 2 processes of the
    command itself end (runs.DETERMINISTIC, 2 epochs)."""
    volume, record, pause = tmp_path / "volume", tmp_path / "record.jsonl", tmp_path / "paused"
    overrides = kubeflow_overrides(
        volume, "launcher.kubeflow.name=sensor-b", f"data.path={deterministic_data}", *DETERMINISTIC,
        "trainer.num_nodes=2", "trainer.devices=1",
        "callbacks.last_checkpoint.train_time_interval=null",
        f"callbacks.last_checkpoint.every_n_train_steps={CHECKPOINT_EVERY}",
        # Where each training starts from; a pause from step 18 on (0.3 s per step) until the file
        # `released` exists, to kill a pod at a known point.
        "+callbacks.probe._target_=probes.ElasticProbe", f"+callbacks.probe.record={record}",
        "+callbacks.probe.kill_rank=-1", "+callbacks.probe.kill_step=-1",
        "+callbacks.pause._target_=probes.PauseAfterStep", "+callbacks.pause.step=18",
        f"+callbacks.pause.marker={pause}", "+callbacks.pause.seconds=0.3",
        f"+callbacks.pause.release={tmp_path / 'released'}",
    )  # fmt: skip
    written = run_cli(TRAIN, *overrides, log_dir=tmp_path / "submitted")
    assert written.returncode == 0, written.stdout[-3000:] + written.stderr[-3000:]
    manifest = yaml.safe_load(next((tmp_path / "submitted" / "runs").glob("*/trainjob.yaml")).read_text())

    pods = trainjob_pods(manifest, tmp_path / "pods.log")
    deadline = time.monotonic() + 300
    while not pause.exists() and all(pod.poll() is None for pod in pods) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pause.exists(), (tmp_path / "pods.log").read_text()[-5000:]
    for pid in process_tree(pods[1].pid):  # pod 1 lost: its torchrun and its worker (a session of its own)
        os.kill(pid, signal.SIGKILL)
    # Pod 0's worker meets the dead peer at its next AllReduce; its torchrun then ends the pod.
    assert pods[0].wait(timeout=120) != 0 and pods[1].wait() == -signal.SIGKILL
    run_dir = volume / "logs" / "runs" / "trainjob-sensor-b"
    assert processes_mentioning(str(volume)) == [], "no worker of either pod left"
    killed_at = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert killed_at >= 15 and killed_at % CHECKPOINT_EVERY == 0

    (tmp_path / "released").touch()
    pods = trainjob_pods(manifest, tmp_path / "pods.log")
    for pod in pods:
        assert pod.wait(timeout=600) == 0, (tmp_path / "pods.log").read_text()[-5000:]
    assert [p.name for p in (volume / "logs" / "runs").iterdir()] == ["trainjob-sensor-b"], "one run, in place"
    first, second = (json.loads(line) for line in record.read_text().splitlines())
    assert first["start_step"] == 0 and (second["start_epoch"], second["start_step"]) == (
        killed_at // 21, killed_at
    ), "the second start continues from the last checkpoint"  # fmt: skip
    log = (run_dir / "train.log").read_text()
    assert f"TrainJob sensor-b started again: fit resumes from the run's latest checkpoint, {run_dir}" in log

    two_processes = deterministic_run("ws2", "trainer.devices=2")
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == STEPS
    assert max_difference(params(run_dir), params(two_processes)) <= PARAM_ATOL
    metrics, reference = (json.loads((d / "metrics.json").read_text()) for d in (run_dir, two_processes))
    assert metrics["world_size"] == reference["world_size"] == 2
    assert metrics["test/mse"] == pytest.approx(reference["test/mse"], rel=1e-5)
    difference = max_difference(params(run_dir), params(two_processes))
    print(
        f"2 pods x 1 process vs 2 processes: max parameter difference {difference:.2e}, test/mse "
        f"{metrics['test/mse']:.6f} vs {reference['test/mse']:.6f}; resumed from the checkpoint of step {killed_at}"
    )
