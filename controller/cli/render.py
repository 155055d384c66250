"""Text for people: the status report, the worker table, a realized cache in one phrase, the
footer of a generation.

Everything here reads the plain data of `intentserve.client` (the same dicts
`--json` prints).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from intentserve.policy import SchedulerIntent

WORKER_COLUMNS = (
    "WORKER",
    "STATE",
    "DEVICE",
    "ADDRESS",
    "CACHE",
    "BACKEND",
    "BLOCKS",
    "KV MEM",
    "WEIGHTS",
    "SCHEDULER",
    "KV USED",
    "REQS",
    "BEAT",
)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [list(headers)] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def mib(num_bytes: int) -> str:
    return f"{num_bytes / 2**20:.0f} MiB" if num_bytes >= 2**20 else f"{num_bytes} B"


def describe_budget(budget: dict[str, Any] | None) -> str:
    if budget and budget["num_bytes"]:
        return f"kv_cache {mib(budget['num_bytes'])}"
    if budget and budget["fraction"]:
        return f"kv_cache {budget['fraction']:.0%} of free memory"
    return "kv_cache the device's default share"


def describe_policy(policy: dict[str, Any] | None, budget: dict[str, Any] | None = None) -> str:
    if policy is None:
        return "unknown"
    if policy["mode"] == "off":
        return f"paged_attention off ({describe_budget(budget)})"
    return (
        f"paged_attention {policy['mode']} (block_size {policy['block_size'] or 16}, "
        f"{describe_budget(budget)}, prefix_caching {policy['prefix_caching']}, "
        f"backend {policy['backend']}, kv_cache_dtype {policy['kv_cache_dtype'] or 'auto'})"
    )


def describe_realized(realized: dict[str, Any] | None) -> str:
    """`paged cache (torch_paged), 728 blocks x 16 tokens, 256 MiB, paged scheduler`."""
    if realized is None:
        return "nothing realized yet"
    unit = "blocks" if realized["cache_kind"] == "paged" else "slots"
    text = (
        f"{realized['cache_kind']} cache ({realized['backend']}), "
        f"{realized['num_blocks']} {unit} x {realized['block_size']} tokens, "
        f"{mib(realized['kv_cache_bytes'])}, {realized['scheduler']} scheduler, "
        f"{realized['weight_format']} weights ({mib(realized['weight_bytes'])})"
    )
    if realized.get("task") == "embed":
        text = f"embeddings ({realized.get('embedding_dim')} values), {text}"
    if realized["prefix_caching"]:
        text += ", prefix caching"
    if realized["sliding_window"]:
        text += (
            f", sliding window {realized['sliding_window']} tokens on "
            f"{realized['num_windowed_layers']} layers (masked)"
        )
    if realized.get("stream_interval"):
        n = realized["stream_interval"]
        text += f", {n} token{'s' * (n > 1)} per message"
    if realized.get("attention_kernel"):
        text += f", attention by {realized['attention_kernel']}"
    if realized.get("decode_graphs"):
        text += f", decode steps from {realized['decode_graphs']}"
    if realized.get("reasoning"):
        markers = realized["reasoning"]
        text += f", reasoning between {markers['start']} and {markers['end']}"
    if realized.get("kernel_variant"):
        text += f", CPU kernels of the {realized['kernel_variant']} variant"
    if realized.get("weights_held"):
        text += f", {realized['weights_held']}"
    return text


def worker_rows(workers: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for w in workers:
        r = w["realized"]
        rows.append(
            [
                w["worker_id"],
                w["state"],
                w["device_kind"],
                w["address"],
                r["cache_kind"] if r else "-",
                r["backend"] if r else "-",
                f"{r['num_blocks']} x {r['block_size']}" if r else "-",
                mib(r["kv_cache_bytes"]) if r else "-",
                f"{r['weight_format']} {mib(r['weight_bytes'])}" if r else "-",
                r["scheduler"] if r else "-",
                f"{w['num_kv_used']}/{w['num_kv_total']}" if w["num_kv_total"] else "-",
                w["num_outstanding"],
                f"{w['last_heartbeat_age_s']:.1f}s",
            ]
        )
    return rows


def workers_text(workers: list[dict[str, Any]]) -> str:
    if not workers:
        return "no worker has registered"
    lines = [table(WORKER_COLUMNS, worker_rows(workers))]
    held = [(w["worker_id"], (w["realized"] or {}).get("weights_held")) for w in workers]
    if any(h for _, h in held):
        lines += ["", "native weights:"]
        lines += [f"  {wid}: {h}" for wid, h in held if h]
    reasons = [(w["worker_id"], r) for w in workers for r in w["reasons"]]
    if reasons:
        lines += ["", "reasons:"]
        lines += [f"  {wid}: {r['code']}: {r['message']}" for wid, r in reasons]
    return "\n".join(lines)


def status_text(status: dict[str, Any]) -> str:
    reason = status["reason"] or {"code": "", "message": ""}
    router = status.get("router")
    if router and router["controller"]:
        return _router_status_text(status, reason, router)
    return "\n".join(
        [
            f"deployment {status['deployment']}: {status['state'].upper()} "
            f"({status['num_verified']} of {status['min_ready']} required replicas verified)",
            f"reason: {reason['code']}: {reason['message']}",
            f"policy: {describe_policy(status['policy'], status.get('kv_budget'))}",
            f"weights: {status.get('weights') or 'auto'}",
            *_scheduler_lines(status.get("scheduler")),
            "",
            workers_text(status["workers"]),
        ]
    )


def _scheduler_lines(scheduler: dict[str, Any] | None) -> list[str]:
    """The spec.scheduler settings the controller checks in each worker's report (none: no
    line)."""
    said = SchedulerIntent(**scheduler).describe() if scheduler else ""
    return [f"scheduler: {said}"] if said else []


def _router_status_text(status: dict[str, Any], reason: dict, router: dict[str, Any]) -> str:
    """A separate router's status: its readiness, its table's freshness, the workers it routes
    to (with its own requests on each)."""
    freshness = router["freshness"]
    if freshness == "fresh":
        table_line = "fresh"
    else:
        table_line = (
            f"{freshness.upper()}: the last verified table, unconfirmed for "
            f"{router['stale_for_s']:.1f} s "
            f"(a stale table is served for {router['max_stale_s']:g} s at most)"
        )
    return "\n".join(
        [
            f"router of deployment {status['deployment']}: {status['state'].upper()} "
            f"({status['num_verified']} workers routed to)",
            f"reason: {reason['code']}: {reason['message']}",
            f"table: revision {router['revision']} from the controller at {router['controller']}, "
            f"{table_line}",
            "",
            workers_text(status["workers"]),
        ]
    )


def generate_footer(choices: Sequence[dict[str, Any]], elapsed_s: float) -> str:
    """The line after a generation's text, from each choice's last chunk (in order of index):
    `[w-0: 3 tokens, finish length, 0.05 s]`; with several choices, every choice's tokens and
    each one's, `[w-0: 6 tokens in 2 choices (3 + 3), finish length, 0.05 s]` (the finish
    reasons one per choice, `length / stop`, when they differ)."""
    worker_id = choices[-1]["worker_id"] if choices else "?"
    counts = [c["num_output_tokens"] for c in choices]
    tokens = f"{sum(counts)} tokens"
    if len(choices) > 1:
        tokens += f" in {len(choices)} choices ({' + '.join(str(n) for n in counts)})"
    finishes = [c["finish_reason"] for c in choices] or ["?"]
    finish = finishes[0] if len(set(finishes)) == 1 else " / ".join(finishes)
    return f"[{worker_id}: {tokens}, finish {finish}, {elapsed_s:.2f} s]"
