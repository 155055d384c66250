"""deploy/monitoring against what a real controller exports: every metric the Grafana dashboard
and the Prometheus alert rules query is a sample name of the controller's /metrics (scraped from
a controller started from deploy/local.yaml's manifest, workers or not); the alerts the issue
asks for are there; the ServiceMonitor selects the controller's Service on its HTTP port."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import httpx2 as httpx
import pytest
import yaml
from intentserve.controller.launch.manifest import load_manifest
from intentserve.controller.server import ControllerServer
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
METRIC = re.compile(r"\bintentserve_[a-z0-9_]+")
# The sample names each family type exports (prometheus_client's text format).
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "info": ("_info",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
}


@pytest.fixture(scope="module")
def exported() -> set[str]:
    config = load_manifest(ROOT / "deploy" / "local.yaml").controller_config()
    config = dataclasses.replace(config, port=0, http_port=0)
    with ControllerServer(config) as server:
        text = httpx.get(f"{server.http_url}/metrics", timeout=5).text
    return {
        family.name + suffix
        for family in text_string_to_metric_families(text)
        for suffix in SUFFIXES[family.type]
    }


def dashboard_queries() -> list[str]:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queries += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    return queries


def alert_rules() -> dict[str, dict]:
    rule = yaml.safe_load((MONITORING / "prometheus-rules.yaml").read_text())
    return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}


def test_the_scrape_holds_the_new_metrics(exported):
    assert {
        "intentserve_kv_cache_usage_ratio",
        "intentserve_request_queue_time_seconds_bucket",
        "intentserve_request_prefill_time_seconds_bucket",
        "intentserve_request_decode_time_seconds_bucket",
        "intentserve_request_prompt_tokens_bucket",
        "intentserve_request_generation_tokens_bucket",
        "intentserve_worker_step_duration_seconds_sum",
        "intentserve_worker_batch_size_count",
        "intentserve_http_requests_refused_total",
        "intentserve_worker_registrations_total",
        "intentserve_deployment_max_restarts",
    } <= exported


def test_every_dashboard_query_names_only_exported_metrics(exported):
    queries = dashboard_queries()
    assert len(queries) > 20
    for query in queries:
        named = set(METRIC.findall(query))
        assert named, query
        assert named <= exported, f"{sorted(named - exported)} in {query}"


def test_every_alert_names_only_exported_metrics(exported):
    for name, rule in alert_rules().items():
        named = set(METRIC.findall(rule["expr"]))
        assert named and named <= exported, f"{name}: {sorted(named - exported)}"


def test_the_alerts_cover_intent_readiness_restarts_and_kv_usage():
    rules = alert_rules()
    assert {
        "IntentserveRealizedNotIntent",
        "IntentserveNotServing",
        "IntentserveRestartBudgetLow",
        "IntentserveKvCacheUsageHigh",
    } <= set(rules)
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"], name


def test_a_query_with_a_misspelt_metric_fails_the_check(exported):
    assert not set(METRIC.findall("rate(intentserve_request_total[5m])")) <= exported


def test_the_service_monitor_scrapes_the_controllers_service_on_its_http_port():
    (monitor,) = yaml.safe_load_all((MONITORING / "servicemonitor.yaml").read_text())
    services = [
        d
        for d in yaml.safe_load_all((ROOT / "deploy" / "k8s" / "controller.yaml").read_text())
        if d["kind"] == "Service"
    ]
    selector = monitor["spec"]["selector"]["matchLabels"]
    (service,) = [s for s in services if selector.items() <= s["metadata"]["labels"].items()]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert (endpoint["path"], endpoint["scheme"]) == ("/metrics", "https")
    assert "secret" not in endpoint["tlsConfig"]["ca"]  # the certificate only, never the CA key
