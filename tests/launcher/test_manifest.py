"""The deployment manifest: what it accepts, what it refuses (naming field, value and what is
allowed), env overrides, and what it hands the controller and the workers."""

from __future__ import annotations

import socket
import textwrap

import pytest
from intentserve.controller.cli.main import main
from intentserve.controller.launch.manifest import ManifestError, load_manifest
from intentserve.controller.launch.serving_spec import MODEL_DTYPES
from intentserve.controller.router.admission import QueueLimits
from intentserve.policy import (
    DeviceKind,
    KvBudget,
    Mode,
    PagedAttentionConfig,
    SchedulerIntent,
    WeightFormat,
)
from intentserve.worker.model.dtype import ALLOWED_DTYPES
from intentserve.worker.runtime.spec import WorkerSpec

MINIMAL = "apiVersion: intentserve/v1\nkind: Deployment\nmetadata: {name: t}\n"


def manifest_file(tmp_path, text: str):
    path = tmp_path / "manifest.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def problems(tmp_path, spec_yaml: str) -> list[str]:
    path = manifest_file(
        tmp_path,
        MINIMAL + spec_yaml,
    )
    with pytest.raises(ManifestError) as caught:
        load_manifest(path)
    return caught.value.problems


@pytest.mark.parametrize(
    ("spec_yaml", "expected"),
    [
        (
            "spec: {pagedAttention: {mode: maybe}}",
            "spec.pagedAttention.mode: invalid value 'maybe'; allowed values are auto, on, off",
        ),
        (
            "spec: {pagedAttention: {prefixCaching: sometimes}}",
            "spec.pagedAttention.prefixCaching: invalid value 'sometimes'; allowed values are "
            "auto, on, off",
        ),
        (
            "spec: {pagedAttention: {backend: flashinfer}}",
            "spec.pagedAttention.backend: invalid value 'flashinfer'; allowed values are auto, "
            "flash, torch, triton",
        ),
        (
            "spec: {pagedAttention: {kvCacheMemory: 12XB}}",
            "spec.pagedAttention.kvCacheMemory: invalid value '12XB'; allowed: bytes",
        ),
        (
            "spec: {pagedAttention: {blockSize: 0}}",
            "spec.pagedAttention.blockSize: invalid value 0; input should be greater than",
        ),
        (
            "spec: {pagedAttention: {mode: 'off', prefixCaching: 'on'}}",
            "spec.pagedAttention.prefixCaching: 'on' has no effect while paged_attention is 'off'",
        ),
        (
            "spec: {pagedAttention: {mode: 'off', backend: flash}}",
            "spec.pagedAttention.backend: 'flash' has no effect while paged_attention is 'off'",
        ),
        (
            "spec: {pagedAttention: {mode: 'off', blockSize: 32}}",
            "spec.pagedAttention.blockSize: 32 has no effect while paged_attention is 'off'",
        ),
        (
            "spec: {pagedAttention: {mode: 'off', kvCacheDtype: bfloat16}}",
            "spec.pagedAttention.kvCacheDtype: 'bfloat16' has no effect while paged_attention is",
        ),
        (
            "spec: {resources: {device: tpu}}",
            "spec.resources.device: invalid value 'tpu'; allowed values are cpu, cuda",
        ),
        (
            "spec: {resources: {device: cuda}}",
            "spec.resources.numGpus: invalid value 0.0; must be > 0 when device is cuda",
        ),
        (
            "spec: {resources: {deviceMap: [cpu, gpu]}}",
            "spec.resources.deviceMap: entries must be cpu, cuda or cuda:N; 'gpu' is not",
        ),
        (
            "spec: {model: {dtype: fp16}}",
            "spec.model.dtype: invalid value 'fp16'; "
            "allowed values are auto, float32, bfloat16, float16",
        ),
        (
            "spec: {model: {weights: q4_1}}",
            "spec.model.weights: invalid value 'q4_1'; allowed values are auto, dequantized, "
            "int8, int4, w8a8",
        ),
        ("spec: {replicas: 0}", "spec.replicas: invalid value 0; input should be greater"),
        (
            "spec: {scheduler: {streamInterval: 0}}",
            "spec.scheduler.streamInterval: invalid value 0; input should be greater than or "
            "equal to 1",
        ),
        # Found trying it: these go on the wire as uint32; past it every worker crashed in a
        # restart loop on "Value out of range" until the restart budget was spent.
        (
            "spec: {scheduler: {streamInterval: 4294967296}}",
            "spec.scheduler.streamInterval: invalid value 4294967296; input should be less than "
            "or equal to 4294967295",
        ),
        (
            "spec: {scheduler: {maxNumSeqs: 4294967296}}",
            "spec.scheduler.maxNumSeqs: invalid value 4294967296; input should be less than or "
            "equal to 4294967295",
        ),
        (
            "spec: {scheduler: {maxModelLen: 4294967296}}",
            "spec.scheduler.maxModelLen: invalid value 4294967296; input should be less than or "
            "equal to 4294967295",
        ),
        (
            "spec: {scheduler: {maxNumBatchedTokens: 4294967296}}",
            "spec.scheduler.maxNumBatchedTokens: invalid value 4294967296; input should be less "
            "than or equal to 4294967295",
        ),
        ("spec: {replicas: 2, minReady: 3}", "spec.minReady: invalid value 3; must be at most"),
        (
            "spec: {controller: {heartbeatIntervalS: 2, heartbeatTimeoutS: 1}}",
            "spec.controller.heartbeatTimeoutS: invalid value 1; must be longer than",
        ),
        (
            "spec: {controller: {admission: {maxQueued: -1}}}",
            "spec.controller.admission.maxQueued: invalid value -1; input should be greater "
            "than or equal to 0",
        ),
        (
            "spec: {controller: {admission: {maxQueueWaitS: 0}}}",
            "spec.controller.admission.maxQueueWaitS: invalid value 0; input should be greater "
            "than 0",
        ),
        (
            "spec: {controller: {admission: {maxQueueWaitS: .inf}}}",
            "spec.controller.admission.maxQueueWaitS: invalid value inf; input should be a "
            "finite number",
        ),
        (
            "spec: {controller: {maxOutstandingPerWorker: 0}}",
            "spec.controller.maxOutstandingPerWorker: invalid value 0; input should be greater",
        ),
        (
            "spec: {router: {maxStaleS: 0}}",
            "spec.router.maxStaleS: invalid value 0; input should be greater than 0",
        ),
        (
            "spec: {router: {maxStaleS: .inf}}",
            "spec.router.maxStaleS: invalid value inf; input should be a finite number",
        ),
        (
            "spec: {router: {host: 0.0.0.0}, security: {insecure: true}}",
            "spec.security.insecure: true and a router binds 0.0.0.0, not loopback",
        ),
        (
            "spec: {pagedAtention: {mode: 'on'}}",
            "spec.pagedAtention: unknown field; allowed fields here are model, replicas,",
        ),
    ],
)
def test_a_bad_field_is_named_with_its_value_and_what_is_allowed(tmp_path, spec_yaml, expected):
    found = problems(tmp_path, spec_yaml)
    assert any(p.startswith(expected) for p in found), found


def test_every_problem_is_listed_at_once(tmp_path):
    found = problems(tmp_path, "spec: {replicas: -1, pagedAttention: {mode: maybe}}")
    assert [p.split(":")[0] for p in found] == ["spec.replicas", "spec.pagedAttention.mode"]


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("apiVersion: v2\nkind: Deployment\nmetadata: {name: t}", "apiVersion: invalid value 'v2'"),
        ("apiVersion: intentserve/v1\nkind: Pod\nmetadata: {name: t}", "kind: invalid value"),
        ("apiVersion: intentserve/v1\nkind: Deployment", "metadata: required field is missing"),
        (
            "apiVersion: intentserve/v1\nkind: Deployment\nmetadata: {name: Not_A_Label}",
            "metadata.name: invalid value 'Not_A_Label'; must be 1-63 lower-case",
        ),
        ("- just\n- a list", "the document must be a mapping"),
        ("apiVersion: [unclosed", "not valid YAML"),
    ],
)
def test_the_document_itself_is_checked(tmp_path, header, expected):
    with pytest.raises(ManifestError) as caught:
        load_manifest(manifest_file(tmp_path, header))
    assert any(p.startswith(expected) for p in caught.value.problems), caught.value.problems


def test_a_missing_file_is_a_manifest_error(tmp_path):
    with pytest.raises(ManifestError, match="cannot read it"):
        load_manifest(tmp_path / "nope.yaml")


def test_yaml_bare_on_means_on(tmp_path):
    path = manifest_file(
        tmp_path,
        """\
        apiVersion: intentserve/v1
        kind: Deployment
        metadata: {name: t}
        spec: {pagedAttention: {mode: on, prefixCaching: off}}
        """,
    )
    pa = load_manifest(path).spec.paged_attention
    assert (pa.mode, pa.prefix_caching) == (Mode.ON, Mode.OFF)


def test_env_vars_override_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("INTENTSERVE_SPEC__REPLICAS", "3")
    monkeypatch.setenv("INTENTSERVE_SPEC__PAGEDATTENTION__MODE", "off")
    monkeypatch.setenv("INTENTSERVE_SPEC__CONTROLLER__PORT", "0")
    m = load_manifest("deploy/local.yaml")
    assert (m.spec.replicas, m.spec.paged_attention.mode, m.spec.controller.port) == (
        3,
        Mode.OFF,
        0,
    )
    assert m.spec.resources.device is DeviceKind.CPU  # untouched fields keep the file's value


def test_an_env_override_of_the_kv_budget_is_read_as_written(monkeypatch):
    monkeypatch.setenv("INTENTSERVE_SPEC__PAGEDATTENTION__KVCACHEMEMORY", "32Mi")
    budget = load_manifest("deploy/local.yaml").spec.paged_attention.kv_cache_memory
    assert budget == KvBudget(num_bytes=32 << 20)


def test_an_env_override_is_validated_like_the_file(monkeypatch):
    monkeypatch.setenv("INTENTSERVE_SPEC__PAGEDATTENTION__MODE", "sometimes")
    with pytest.raises(ManifestError, match="spec.pagedAttention.mode: invalid value 'sometimes'"):
        load_manifest("deploy/local.yaml")


def test_the_controller_gets_the_policy_the_budget_and_the_replicas():
    config = load_manifest("deploy/local.yaml").controller_config()
    desired = config.desired
    assert desired.deployment == "local"
    assert (desired.replicas, desired.min_ready) == (2, 2)
    assert desired.policy == PagedAttentionConfig(required=True)
    assert desired.kv_budget == KvBudget(num_bytes=256 << 20)
    assert (config.host, config.port) == ("127.0.0.1", 50051)
    assert (desired.model, config.http_port) == ("smollm2-135m", 8000)
    assert desired.weights is WeightFormat.AUTO


@pytest.mark.parametrize(
    ("word", "fmt"),
    [("INT4", WeightFormat.INT4), ("w8a8", WeightFormat.W8A8), ("native", WeightFormat.NATIVE)],
)
def test_the_weight_format_travels_to_the_desired_state(tmp_path, word, fmt):
    path = manifest_file(tmp_path, MINIMAL + f"spec: {{model: {{weights: {word}}}}}\n")
    assert load_manifest(path).controller_config().desired.weights is fmt


def test_the_http_api_is_on_by_default_and_null_turns_it_off(tmp_path):
    assert load_manifest(manifest_file(tmp_path, MINIMAL)).controller_config().http_port == 8000
    path = manifest_file(tmp_path, MINIMAL + "spec: {controller: {httpPort: null}}\n")
    assert load_manifest(path).controller_config().http_port is None
    path = manifest_file(tmp_path, MINIMAL + "spec: {model: {name: my-model}}\n")
    assert load_manifest(path).controller_config().desired.model == "my-model"


def test_off_with_the_budget_only_is_valid_and_the_budget_still_applies(tmp_path):
    # The KV budget is not a paged-cache option: the contiguous cache takes its slots from it.
    path = tmp_path / "off.yaml"
    path.write_text(MINIMAL + "spec: {pagedAttention: {mode: 'off', kvCacheMemory: 64Mi}}\n")
    desired = load_manifest(path).controller_config().desired
    assert desired.policy is None
    assert desired.kv_budget == KvBudget(num_bytes=64 << 20)


def test_a_worker_config_is_a_valid_worker_spec():
    m = load_manifest("deploy/local.yaml")
    spec = WorkerSpec.from_dict(m.worker_config("local-0", "127.0.0.1:50051", "127.0.0.1"))
    assert (spec.worker_id, spec.controller_address, spec.host) == (
        "local-0",
        "127.0.0.1:50051",
        "127.0.0.1",
    )
    assert (spec.model, spec.device, spec.max_model_len, spec.max_num_seqs) == (
        "smollm2-135m",
        "cpu",
        2048,
        16,
    )
    assert spec.num_threads == 1  # the KV budget reaches the worker from the controller, only
    assert m.worker_ids() == ["local-0", "local-1"]


def test_the_stream_interval_reaches_the_worker_and_defaults_to_every_token(tmp_path):
    default = load_manifest("deploy/local.yaml")
    assert default.worker_config("w", "127.0.0.1:1", "127.0.0.1")["stream_interval"] == 1
    path = manifest_file(tmp_path, MINIMAL + "spec: {scheduler: {streamInterval: 4}}\n")
    config = load_manifest(path).worker_config("w", "127.0.0.1:1", "127.0.0.1")
    assert WorkerSpec.from_dict(config).stream_interval == 4


def test_the_scheduler_settings_a_worker_must_report_travel_to_the_desired_state(tmp_path):
    default = load_manifest("deploy/local.yaml").controller_config().desired
    # deploy/local.yaml sets maxModelLen 2048 and leaves streamInterval at its default, 1
    assert default.scheduler == SchedulerIntent(stream_interval=1, max_model_len=2048)
    path = manifest_file(tmp_path, MINIMAL + "spec: {scheduler: {streamInterval: 4}}\n")
    desired = load_manifest(path).controller_config().desired
    # maxModelLen not written: the model's own (capped) is the worker's to choose
    assert desired.scheduler == SchedulerIntent(stream_interval=4, max_model_len=None)


def test_admission_follows_the_workers_unless_the_manifest_sets_it(tmp_path):
    config = load_manifest("deploy/local.yaml").controller_config()
    assert config.max_outstanding_per_worker is None  # each worker's realized slots
    assert config.admission == QueueLimits(max_queued=None, max_wait_s=300.0)  # 4 x the slots
    written = (
        "spec: {controller: {maxOutstandingPerWorker: 8, "
        "admission: {maxQueued: 0, maxQueueWaitS: 2.5}}}\n"
    )
    config = load_manifest(manifest_file(tmp_path, MINIMAL + written)).controller_config()
    assert config.max_outstanding_per_worker == 8
    assert config.admission == QueueLimits(max_queued=0, max_wait_s=2.5)


def test_the_model_dtypes_mirror_the_workers():
    assert MODEL_DTYPES == ALLOWED_DTYPES


def test_up_exits_2_on_a_bad_manifest_before_starting_anything(tmp_path, capsys):
    path = manifest_file(
        tmp_path,
        "apiVersion: intentserve/v1\nkind: Deployment\nmetadata: {name: t}\n"
        "spec: {pagedAttention: {mode: maybe}}\n",
    )
    assert main(["up", str(path)]) == 2
    err = capsys.readouterr().err
    assert (
        "spec.pagedAttention.mode: invalid value 'maybe'; allowed values are auto, on, off" in err
    )


@pytest.mark.parametrize(
    ("spec_yaml", "expected"),
    [
        # CPU workers share the node's memory: the embedded cluster is one node.
        (
            "spec: {replicas: 2, pagedAttention: {kvCacheMemory: 60%}}",
            "spec.pagedAttention.kvCacheMemory: 2 replicas share one node's free memory: "
            "2 x 60% is 120% (at most 100%); give each at most 50%, or a size in bytes",
        ),
        (
            "spec: {replicas: 3, pagedAttention: {kvCacheMemory: 40%}}",
            "spec.pagedAttention.kvCacheMemory: 3 replicas share one node's free memory: "
            "3 x 40% is 120% (at most 100%); give each at most 33%, or a size in bytes",
        ),
        # Fractional GPUs: 1 / numGpus workers share a GPU's memory.
        (
            "spec: {replicas: 3, resources: {device: cuda, numGpus: 0.5}, "
            "pagedAttention: {kvCacheMemory: 60%}}",
            "spec.pagedAttention.kvCacheMemory: 2 replicas share one GPU's free memory: "
            "2 x 60% is 120% (at most 100%); give each at most 50%, or a size in bytes",
        ),
        ("spec: {replicas: 2, pagedAttention: {kvCacheMemory: 50%}}", None),
        ("spec: {replicas: 1, pagedAttention: {kvCacheMemory: 100%}}", None),
        ("spec: {replicas: 4, pagedAttention: {kvCacheMemory: 4Gi}}", None),
        ("spec: {replicas: 4}", None),  # the default share (10%) is the worker's own
        (
            "spec: {replicas: 2, resources: {device: cuda, numGpus: 1}, "
            "pagedAttention: {kvCacheMemory: 90%}}",
            None,  # a GPU each
        ),
    ],
)
def test_percent_budgets_that_share_one_memory_must_fit_in_it(tmp_path, spec_yaml, expected):
    path = manifest_file(tmp_path, MINIMAL + spec_yaml)
    if expected is None:
        load_manifest(path)
        return
    with pytest.raises(ManifestError) as caught:
        load_manifest(path)
    assert caught.value.problems == [expected]
    # On a joined cluster Ray decides the placement: the manifest is accepted, `up` warns.
    assert load_manifest(path, one_node=False).shared_kv_problem() == expected


def test_up_refuses_an_overcommitted_percent_budget_before_starting_anything(
    tmp_path, monkeypatch, capsys
):
    path = manifest_file(
        tmp_path, MINIMAL + "spec: {replicas: 2, pagedAttention: {kvCacheMemory: 60%}}"
    )
    with socket.socket() as taken:  # were it not refused, `up` would stop at the taken port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setenv("INTENTSERVE_SPEC__CONTROLLER__PORT", str(taken.getsockname()[1]))
        assert main(["up", str(path)]) == 2
    assert "spec.pagedAttention.kvCacheMemory: 2 replicas share one node's free memory" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_float16_passes_the_manifest_and_reaches_the_worker(tmp_path, device):
    # Whether the worker's device computes fp16 is the worker's to say (CPU flags); a CPU
    # without native fp16 refuses it at load, naming dtype and why (test_model_registry.py).
    extra = ", numGpus: 1" if device == "cuda" else ""
    path = manifest_file(
        tmp_path,
        MINIMAL + f"spec: {{model: {{dtype: float16}}, resources: {{device: {device}{extra}}}}}",
    )
    manifest = load_manifest(path)
    assert manifest.worker_config("t-0", "127.0.0.1:1", "127.0.0.1")["dtype"] == "float16"


def test_cors_is_off_by_default_and_takes_origins(tmp_path):
    assert load_manifest(manifest_file(tmp_path, MINIMAL)).controller_config().cors_origins == ()
    spec = "spec: {controller: {http: {corsOrigins: ['https://app.example', '*']}}}\n"
    config = load_manifest(manifest_file(tmp_path, MINIMAL + spec)).controller_config()
    assert config.cors_origins == ("https://app.example", "*")


@pytest.mark.parametrize(
    "origin", ["app.example", "https://app.example/path", "ftp://app.example", "https://"]
)
def test_a_cors_origin_that_is_not_one_is_refused_naming_the_field(tmp_path, origin):
    found = problems(tmp_path, f"spec: {{controller: {{http: {{corsOrigins: ['{origin}']}}}}}}")
    assert any("spec.controller.http.corsOrigins" in p and origin in p for p in found), found


def test_a_separate_routers_fields_default_and_travel_to_its_config(tmp_path):
    from intentserve.controller.auth import Security
    from intentserve.controller.launch.router_spec import router_config

    default = load_manifest(manifest_file(tmp_path, MINIMAL + "spec: {}"))
    assert (default.spec.router.port, default.spec.router.max_stale_s) == (50061, 30.0)
    path = manifest_file(tmp_path, MINIMAL + "spec: {router: {port: 0, httpPort: 0, maxStaleS: 5}}")
    config = router_config(load_manifest(path), "c:1", Security())
    assert (config.controller, config.port, config.http_port, config.max_stale_s) == (
        "c:1",
        0,
        0,
        5.0,
    )


TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"


def _worker_template(path) -> str | None:
    config = load_manifest(path).worker_config("w", "127.0.0.1:1", "127.0.0.1")
    return WorkerSpec.from_dict(config).engine_config(None, KvBudget()).chat_template


def test_no_chat_template_leaves_the_checkpoints():
    assert _worker_template("deploy/local.yaml") is None


def test_an_inline_chat_template_reaches_the_worker(tmp_path):
    path = manifest_file(tmp_path, MINIMAL)
    path.write_text(path.read_text() + "spec:\n  model:\n    chatTemplate: " + repr(TEMPLATE))
    assert _worker_template(path) == TEMPLATE


def test_a_chat_template_file_is_read_at_load(tmp_path, monkeypatch):
    template = tmp_path / "chat.jinja"
    template.write_text(TEMPLATE)
    path = manifest_file(tmp_path, MINIMAL + f"spec: {{model: {{chatTemplate: '{template}'}}}}\n")
    assert _worker_template(path) == TEMPLATE
    monkeypatch.setenv("INTENTSERVE_SPEC__MODEL__CHATTEMPLATE", str(template))
    assert load_manifest("deploy/local.yaml").spec.model.chat_template == TEMPLATE


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("'{% for m in messages %}'", "chat template does not compile"),
        ("'{{ messages[0] '", "chat template does not compile"),
        ("no-such-template.jinja", "is neither a template (no {{ or {%) nor a readable file"),
    ],
)
def test_a_chat_template_that_cannot_be_used_is_named(tmp_path, value, expected):
    found = problems(tmp_path, f"spec: {{model: {{chatTemplate: {value}}}}}")
    assert any(p.startswith("spec.model.chatTemplate: ") and expected in p for p in found), found
