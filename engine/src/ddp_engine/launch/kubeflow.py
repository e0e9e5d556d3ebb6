"""The Kubeflow TrainJob of a command (``launcher=kubeflow``): the manifest that runs the same command
on a Kubernetes cluster through Kubeflow Trainer v2, written (and, when asked, submitted) instead of
starting the processes on this machine.

Kubeflow Trainer's torch runtime (the ``torch-distributed`` ClusterTrainingRuntime) starts one pod
per node (``numNodes``) of its replicated job ``node`` and gives that pod's container, also
``node``, torchrun's settings: ``PET_NNODES``, ``PET_NPROC_PER_NODE`` (``numProcPerNode``),
``PET_NODE_RANK`` (the pod's index), ``PET_MASTER_ADDR`` (node 0's pod) and ``PET_MASTER_PORT``.
torchrun reads each ``PET_<FLAG>`` as the default of its flag, so the manifest's command is a plain
``torchrun -m <package>.<command> <overrides>``; Lightning then sees torchrun's environment
(``TorchElasticEnvironment``). Lightning's ``KubeflowEnvironment`` (the Training Operator's
PyTorchJob's ``WORLD_SIZE`` / ``RANK`` per pod) is only used when passed as a plugin: not here.

No ``PET_*`` variable names the job, so the manifest sets ``DDP_ENGINE_TRAINJOB`` to the TrainJob's
name: every pod's run directory is then ``<launcher.kubeflow.log_dir>/runs/trainjob-<name>`` on the
shared volume, and a pod that Kubernetes starts again resumes that run in place from its latest
``last.ckpt`` (:func:`ddp_engine.core.environment.resumes_in_place`).
"""

import logging
import re
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig

from ddp_engine.core.environment import TRAINJOB_ENV
from ddp_engine.core.errors import ConfigValueError, UsageError, first_line
from ddp_engine.core.files import write_atomically

log = logging.getLogger(__name__)

#: The torch runtime's replicated job and its trainer container (Kubeflow Trainer's ``constants.Node``).
NODE = "node"
#: The name of the shared volume in the pods, and of this patch's manager (``runtimePatches``).
VOLUME_NAME, PATCH_MANAGER = "runs", "ddp-engine"
#: A TrainJob's name: a DNS-1035 label (its JobSet's and pods' names start with it).
NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
#: Overrides that configure this manifest, not the run in the pods.
OWN_KEYS = ("launcher", "launcher.kubeflow.", "paths.log_dir")


def check_train_job(kubeflow: DictConfig, devices: Any, multirun: bool, accelerator: str = "auto") -> None:
    """Refuse a TrainJob that cannot run: a ``-m`` sweep's (one TrainJob per command: its name is
    the run's), an unset ``image`` or ``volume``, a ``name`` Kubernetes
    refuses, a ``trainer.devices`` that is not a number (its processes per pod), fewer GPUs per pod
    than ``trainer.devices`` on ``trainer.accelerator=gpu`` (one process per GPU), a missing
    kubernetes extra; and with ``submit=true``, no cluster to submit to (:func:`cluster`).

    Raises:
        ConfigValueError: naming the key and the fix.
    """
    if multirun:
        raise ConfigValueError(
            "launcher=kubeflow writes the TrainJob of one run: run each job of the sweep as a command of its own, "
            "with its own launcher.kubeflow.name (without -m)."
        )
    for key, what in (("image", "the container image with the project installed"),
                      ("volume", "the PersistentVolumeClaim (ReadWriteMany) that holds the runs")):  # fmt: skip
        if not kubeflow.get(key):
            raise ConfigValueError(f"launcher.kubeflow.{key} is not set: launcher=kubeflow needs {what}.")
    if not NAME.fullmatch(kubeflow.name):
        raise ConfigValueError(
            f"launcher.kubeflow.name={kubeflow.name}: a TrainJob's name is a DNS label, lowercase letters, digits "
            "and '-', starting with a letter, at most 63 characters."
        )
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
        raise ConfigValueError(
            f"trainer.devices={devices}: launcher=kubeflow runs trainer.devices processes in each pod, a number: "
            "set trainer.devices=<GPUs per node> (or processes per CPU node)."
        )
    gpus = kubeflow.gpus_per_node
    if gpus is not None and accelerator in ("gpu", "cuda") and gpus < devices:
        raise ConfigValueError(
            f"launcher.kubeflow.gpus_per_node={gpus} is fewer than trainer.devices={devices}, the processes of each "
            f"pod, one per GPU: set launcher.kubeflow.gpus_per_node={devices} (or leave it null: trainer.devices)."
        )
    try:
        import kubeflow_trainer_api  # noqa: F401
    except ImportError:
        raise ConfigValueError(
            "launcher=kubeflow needs Kubeflow Trainer's API models: pip install 'ddp-engine[kubernetes]'."
        ) from None
    if kubeflow.submit:
        cluster(kubeflow.namespace)


def pod_arguments(module: str, overrides: list[str], log_dir: str) -> list[str]:
    """torchrun's arguments in every pod: ``-m <module>``, the command's ``overrides`` without those
    of the manifest itself (:data:`OWN_KEYS`), and the run's log folder on the shared volume."""
    kept = [arg for arg in overrides if not arg.lstrip("+~").startswith(OWN_KEYS)]
    return ["-m", module, *kept, f"paths.log_dir={log_dir}"]


def train_job(cfg: DictConfig, module: str, overrides: list[str]) -> dict:
    """The TrainJob (``trainer.kubeflow.org/v1alpha1``) that runs ``python -m <module> <overrides>``
    under ``launcher.kubeflow``'s settings, as Kubeflow Trainer's API models (its ``kubeflow-trainer-api``
    package) validate and write it.

    Raises:
        pydantic.ValidationError: a value of a type the API refuses.
    """
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob

    kubeflow = cfg.launcher.kubeflow
    gpus = kubeflow.gpus_per_node
    if gpus is None:
        gpus = cfg.trainer.devices if cfg.trainer.accelerator in ("gpu", "cuda") else 0
    requests = {"cpu": kubeflow.cpu_per_node, "memory": kubeflow.memory_per_node}
    resources = {key: str(value) for key, value in {**requests, "nvidia.com/gpu": gpus or None}.items() if value}
    trainer = {
        "image": kubeflow.image,
        "numNodes": cfg.trainer.num_nodes,
        "numProcPerNode": cfg.trainer.devices,
        "command": ["torchrun"],
        "args": pod_arguments(module, overrides, kubeflow.log_dir),
        "env": [{"name": TRAINJOB_ENV, "value": kubeflow.name}],
        **({"resourcesPerNode": {"requests": resources, "limits": resources}} if resources else {}),
    }
    pod = {
        "volumes": [{"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": kubeflow.volume}}],
        "containers": [{"name": NODE, "volumeMounts": [{"name": VOLUME_NAME, "mountPath": kubeflow.mount_path}]}],
    }
    volume_patch = {
        "manager": PATCH_MANAGER,
        "trainingRuntimeSpec": {
            "template": {
                "spec": {"replicatedJobs": [{"name": NODE, "template": {"spec": {"template": {"spec": pod}}}}]}
            }
        },
    }
    manifest = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": kubeflow.name, **({"namespace": kubeflow.namespace} if kubeflow.namespace else {})},
        "spec": {"runtimeRef": {"name": kubeflow.runtime}, "trainer": trainer, "runtimePatches": [volume_patch]},
    }
    return TrainerV1alpha1TrainJob.from_dict(manifest).to_dict()


def write_train_job(cfg: DictConfig, module: str, overrides: list[str]) -> dict:
    """Write the TrainJob of this command to ``launcher.kubeflow.manifest`` and, with
    ``launcher.kubeflow.submit=true``, submit it (:func:`submit`).

    Returns:
        The job's record: ``status`` (``written`` or ``submitted``), the TrainJob's name, the manifest's path.

    Raises:
        UsageError: submitting failed (no cluster configured, the API refused it); the manifest is written.
    """
    kubeflow = cfg.launcher.kubeflow
    manifest = train_job(cfg, module, overrides)
    path = Path(kubeflow.manifest)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, yaml.safe_dump(manifest, sort_keys=False))
    log.info(f"TrainJob {kubeflow.name}: {path}. Its run directory: {kubeflow.log_dir}/runs/trainjob-{kubeflow.name}")
    if not kubeflow.submit:
        log.info(f"Submit it with: kubectl apply -f {path}")
        return {"status": "written", "trainjob": kubeflow.name, "manifest": str(path)}
    namespace = submit(manifest, kubeflow.namespace, path)
    log.info(f"TrainJob {namespace}/{kubeflow.name} submitted: kubectl get trainjob {kubeflow.name} -n {namespace}")
    return {"status": "submitted", "trainjob": kubeflow.name, "manifest": str(path)}


def cluster(namespace: str | None) -> Any:
    """The Kubeflow SDK's client (``kubeflow.trainer.TrainerClient``, its Kubernetes backend) for the
    cluster of the kube config (``KUBECONFIG``, else ``~/.kube/config``, else the pod's own service
    account), in ``namespace`` (None: the kube context's).

    Raises:
        ConfigValueError: the SDK missing, or no cluster configured or reachable.
    """
    try:
        from kubeflow.trainer import KubernetesBackendConfig, TrainerClient
    except ImportError:
        raise ConfigValueError(
            "launcher.kubeflow.submit=true needs the Kubeflow SDK: pip install 'ddp-engine[kubernetes]'."
        ) from None
    try:
        return TrainerClient(KubernetesBackendConfig(namespace=namespace))
    except Exception as error:  # the kubernetes client's ConfigException, a refused connection, ...
        raise ConfigValueError(
            f"launcher.kubeflow.submit=true: no Kubernetes cluster to submit to ({first_line(error)}). Set KUBECONFIG "
            "or the kube context, or leave launcher.kubeflow.submit=false to write the manifest only."
        ) from None


def submit(manifest: dict, namespace: str | None, path: Path) -> str:
    """Create the TrainJob ``manifest`` on the :func:`cluster`, with the Kubernetes client, namespace
    and API group that the SDK's ``TrainerClient.train`` creates its TrainJobs with (``train`` itself
    builds a TrainJob of its own, and cannot set ``numProcPerNode``). ``path``: the written manifest,
    named in a refusal.

    Returns:
        The namespace it was created in.

    Raises:
        UsageError: no cluster, or the API refused the TrainJob (an existing name, a missing runtime, no rights).
    """
    from kubeflow.trainer.constants import constants

    backend = cluster(namespace).backend
    try:
        backend.custom_api.create_namespaced_custom_object(
            constants.GROUP, constants.VERSION, backend.namespace, constants.TRAINJOB_PLURAL, manifest
        )
    except Exception as error:  # the API's ApiException, a lost connection
        raise UsageError(
            f"launcher.kubeflow.submit=true: the cluster refused TrainJob {manifest['metadata']['name']} "
            f"({first_line(error)}). The manifest is written: kubectl apply -f {path} submits it once that is fixed."
        ) from None
    return backend.namespace
