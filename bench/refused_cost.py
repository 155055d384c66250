"""What refused requests cost the requests being served (issue 60): the inter-token latency of
innocent streams alone and beside clients sending worst-case refused requests in a loop, on one
`intentserve up` deployment (SmolLM2, security on, an API key), through the OpenAI HTTP API.

    python bench/refused_cost.py
    python bench/refused_cost.py --runs 1 --kinds long_message --streams 2 --clients 1 \\
        --max-tokens 8   # the smallest: what tests/test_bench_refused_cost.py runs

Results go to `--out`, by default ~/.cache/intentserve/bench/refused_cost.json
(under `$XDG_CACHE_HOME` when set; bench/out.py): outside the source tree.

The innocent load: `--streams` concurrent streaming chat completions, greedy, EOS ignored,
`--max-tokens` tokens each; ITL is the time between a stream's consecutive content chunks (one a
token), p99 over every stream. The refused kinds, each sent by `--clients` clients in a loop:
- long_message: one user message of 1.3M words (2.6 MB), max_tokens 8;
- largest_passing: the largest message that passes every cheap check (its rendered prompt as
  many bytes as max_model_len - 1 tokens of the longest token cover) but is refused once
  tokenized;
- turns_1e5: 10^5 turns; tools_1e4: 10^4 tools (the deployment's template renders tools: the
  model's own with every tool as JSON before it);
- tokenize_long: /tokenize of the 1.3M words;
and the largest a router forwards (controller/router/request_size.py: turns, tools, characters),
which only the worker's own checks refuse:
- turns_router_max: the router's most turns, with its most characters between them;
- tools_router_max: the router's most tools, its most characters in their descriptions;
- tool_calls_2e4: an assistant turn of 2 x 10^4 calls (the router counts their characters);
- tokenize_router_max: /tokenize of the router's most characters;
and the reference, tokenize_word: the same clients looping the cheapest served request on that
path (/tokenize of one word), what any closed loop of requests costs the streams here.
Each run measures, for each kind, the innocent streams alone and then beside the refused load,
and alone once more at the end (the machine's speed drifts): ratio = ITL p99 beside / the mean of
the p99s alone just before and after. The target: ratio <= 1.5 for every kind, and every refused
request answered 4xx naming a field (tokenize_word's are all served).
"""

from __future__ import annotations

import sys
from pathlib import Path

# ruff: noqa: E402
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import argparse
import collections
import contextlib
import json
import os
import ssl
import statistics
import tempfile
import threading
import time

import httpx2 as httpx
from intentserve.client.credentials import folder_for
from intentserve.controller.router.request_size import MAX_MESSAGES, MAX_TOKEN_CHARS, MAX_TOOLS
from intentserve.worker.engine.chat import Conversation
from intentserve.worker.model.gguf_loader import GGUFFile
from intentserve.worker.model.gguf_tokenizer import build_gguf_tokenizer
from intentserve.worker.model.registry import resolve_model_path
from intentserve.worker.model.token_bound import token_bound

from bench.machine import describe, machine_info
from bench.out import default_out
from bench.served import Deployment
from bench.workloads import MAX_MODEL_LEN, MODEL, PROMPTS

TARGET = 1.5
API_KEY = "bench-key"
NUM_WORDS = 1_300_000
KINDS = (
    "long_message",
    "largest_passing",
    "turns_1e5",
    "tools_1e4",
    "tokenize_long",
    "turns_router_max",
    "tools_router_max",
    "tool_calls_2e4",
    "tokenize_router_max",
)
# The reference: as many clients looping the cheapest served request on the same path (/tokenize
# of one word): what any closed loop of requests costs the streams on these cores.
CONTROL = "tokenize_word"
TOOLS_FIRST = "{% if tools %}{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif %}"
MANIFEST = """\
apiVersion: intentserve/v1
kind: Deployment
metadata: {{name: refused-cost}}
spec:
  model: {{name: {model}, chatTemplate: {template}}}
  replicas: 1
  resources: {{device: cpu, numCpus: 2}}
  pagedAttention: {{mode: "on", kvCacheMemory: 256Mi}}
  scheduler: {{maxNumSeqs: {seqs}, maxModelLen: {max_model_len}}}
  controller: {{maxOutstandingPerWorker: {seqs}}}
  security: {{apiKeysFile: {keys}}}
"""


def refused_requests(template: str) -> dict[str, tuple[str, bytes]]:
    """Each kind's (path, JSON body), serialized once so that the clients only send bytes."""
    own = build_gguf_tokenizer(GGUFFile(resolve_model_path(MODEL)).metadata)
    tokenizer = own.with_chat_template(template)
    bound_bytes = token_bound(own.backend).max_bytes_per_token * (MAX_MODEL_LEN - 1)
    overhead = len(Conversation.user("").render(tokenizer).encode())
    largest = ("a " * bound_bytes)[: bound_bytes - overhead].strip()
    words = "a " * NUM_WORDS
    router_chars = MAX_MODEL_LEN * MAX_TOKEN_CHARS  # what a router forwards at most
    turn_chars = router_chars // MAX_MESSAGES - 1
    tool_chars = router_chars // MAX_TOOLS - 8

    def chat(messages: list[dict], **extra) -> tuple[str, bytes]:
        body = {"model": MODEL, "messages": messages, "max_tokens": 8, **extra}
        return "/v1/chat/completions", json.dumps(body).encode()

    def tokenize(prompt: str) -> tuple[str, bytes]:
        return "/tokenize", json.dumps({"model": MODEL, "prompt": prompt}).encode()

    def user(content: str) -> dict:
        return {"role": "user", "content": content}

    def tools(num: int, description: str = "") -> list[dict]:
        return [
            {"type": "function", "function": {"name": f"f{i}", "description": description}}
            for i in range(num)
        ]

    calls = [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        for _ in range((router_chars - 1) // 3)
    ]
    return {
        "long_message": chat([user(words)]),
        "largest_passing": chat([user(largest)]),
        "turns_1e5": chat([user("a")] * 100_000),
        "tools_1e4": chat([user("a")], tools=tools(10_000)),
        "tokenize_long": tokenize(words),
        # What a router forwards (request_size.py): the worker's own checks refuse them.
        "turns_router_max": chat([user(("a " * turn_chars)[:turn_chars])] * MAX_MESSAGES),
        "tools_router_max": chat([user("a")], tools=tools(MAX_TOOLS, "d " * (tool_chars // 2))),
        "tool_calls_2e4": chat(
            [{"role": "assistant", "content": None, "tool_calls": calls}, user("a")],
            tools=tools(1),
        ),
        "tokenize_router_max": tokenize(("a " * router_chars)[:router_chars]),
        CONTROL: tokenize("hello"),
    }


def innocent_round(client: httpx.Client, streams: int, max_tokens: int) -> dict:
    """The ITL samples and first-chunk latencies (s) of `streams` concurrent greedy streams."""
    gaps: list[float] = []
    firsts: list[float] = []
    errors: list[BaseException] = []

    def run(i: int) -> None:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"Request {i}. {PROMPTS[i % len(PROMPTS)]}"}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        try:
            start = last = time.perf_counter()
            with client.stream("POST", "/v1/chat/completions", json=body) as response:
                response.raise_for_status()
                for line in response.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    choices = json.loads(line[6:])["choices"]
                    if not choices or not choices[0]["delta"].get("content"):
                        continue
                    now = time.perf_counter()
                    (firsts if last == start else gaps).append(now - last)
                    last = now
        except BaseException as error:  # noqa: BLE001 - reported below, the round is void
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} innocent streams failed: {errors[0]!r}")
    return {"gaps_s": gaps, "firsts_s": firsts}


class RefusedLoad:
    """`clients` threads sending one refused request after another until the phase ends."""

    def __init__(self, client: httpx.Client, path: str, body: bytes, clients: int) -> None:
        self._client, self._path, self._body = client, path, body
        self._stop = threading.Event()
        self.answers: list[tuple[float, int, str | None]] = []  # latency, status, param
        self._threads = [threading.Thread(target=self._loop) for _ in range(clients)]

    def _loop(self) -> None:
        headers = {"content-type": "application/json"}
        while not self._stop.is_set():
            start = time.perf_counter()
            try:
                response = self._client.post(self._path, content=self._body, headers=headers)
            except httpx.HTTPError as error:  # no answer at all: status 0, never "refused"
                self.answers.append((time.perf_counter() - start, 0, None))
                print(f"  a refused-load request failed: {error!r}", flush=True)
                continue
            param = response.json()["error"].get("param") if response.is_client_error else None
            self.answers.append((time.perf_counter() - start, response.status_code, param))

    def __enter__(self) -> RefusedLoad:
        for t in self._threads:
            t.start()
        time.sleep(0.5)  # every client's first request under way
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98]


def phase(client: httpx.Client, args, load: RefusedLoad | None = None) -> dict:
    """One innocent round (beside `load`, when given) and its ITL."""
    start_s = time.perf_counter()
    with load or contextlib.nullcontext():
        result = innocent_round(client, args.streams, args.max_tokens)
    return {
        "wall_s": time.perf_counter() - start_s,
        "itl_p99_s": p99(result["gaps_s"]),
        "itl_p50_s": statistics.median(result["gaps_s"]),
        "first_chunk_p50_s": statistics.median(result["firsts_s"]),
        "num_gaps": len(result["gaps_s"]),
    }


def refused_summary(answers: list[tuple[float, int, str | None]]) -> dict:
    latencies = [a[0] for a in answers]
    return {
        "num": len(answers),
        "all_refused_naming_a_field": all(400 <= s < 500 and p for _, s, p in answers),
        "statuses": dict(collections.Counter(str(s) for _, s, _ in answers)),
        "params": dict(collections.Counter(str(p) for _, _, p in answers)),
        "latency_p50_s": statistics.median(latencies),
        "latency_max_s": max(latencies),
    }


def one_run(client: httpx.Client, requests: dict, args) -> dict:
    alones = [phase(client, args)]
    kinds = {}
    for kind in args.kinds:
        path, body = requests[kind]
        load = RefusedLoad(client, path, body, args.clients)
        beside = phase(client, args, load)
        alones.append(phase(client, args))
        before, after = alones[-2], alones[-1]
        alone_p99 = (before["itl_p99_s"] + after["itl_p99_s"]) / 2
        kinds[kind] = {
            "alone_itl_p99_s": alone_p99,
            "beside": beside,
            "ratio": beside["itl_p99_s"] / alone_p99,
            "refused": refused_summary(load.answers),
        }
        k = kinds[kind]
        print(
            f"  {kind:<19} ITL p99 alone {1000 * alone_p99:6.1f} ms, beside "
            f"{1000 * beside['itl_p99_s']:6.1f} ms: ratio {k['ratio']:.2f}; "
            f"{k['refused']['num']} sent in {beside['wall_s']:.1f} s, latency p50 "
            f"{k['refused']['latency_p50_s']:.3f} s max {k['refused']['latency_max_s']:.3f} s, "
            f"statuses {k['refused']['statuses']} params {k['refused']['params']}",
            flush=True,
        )
    return {"alone": alones, "kinds": kinds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--kinds", default=",".join((CONTROL, *KINDS)))
    parser.add_argument("--out", type=Path, default=default_out("refused_cost.json"))
    args = parser.parse_args(argv)
    args.kinds = args.kinds.split(",")
    host = machine_info()
    print(f"host: {describe(host)}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="intentserve-bench-"))
    os.environ["INTENTSERVE_HOME"] = str(work / "home")
    (work / "keys").write_text(f"{API_KEY}\n")
    own = build_gguf_tokenizer(GGUFFile(resolve_model_path(MODEL)).metadata).chat_template
    template = TOOLS_FIRST + own
    (work / "template.jinja").write_text(template)
    requests = refused_requests(template)
    seqs = args.streams + args.clients
    (work / "manifest.yaml").write_text(
        MANIFEST.format(
            model=MODEL,
            template=work / "template.jinja",
            seqs=seqs,
            max_model_len=MAX_MODEL_LEN,
            keys=work / "keys",
        )
    )
    runs = []
    with Deployment(work / "manifest.yaml", work, api_key=API_KEY) as d:
        verify = ssl.create_default_context(cafile=str(folder_for(d.address) / "ca.crt"))
        with httpx.Client(
            base_url=f"https://127.0.0.1:{d.http_port}",
            verify=verify,
            headers={"authorization": f"Bearer {API_KEY}"},
            limits=httpx.Limits(max_connections=seqs, max_keepalive_connections=seqs),
            timeout=600,
        ) as client:
            innocent_round(client, args.streams, 8)  # warm-up: kernels, caches, connections
            for kind in args.kinds:
                path, body = requests[kind]
                client.post(path, content=body, headers={"content-type": "application/json"})
            for r in range(args.runs):
                print(f"run {r + 1}:", flush=True)
                runs.append(one_run(client, requests, args))
    ratios = {k: [run["kinds"][k]["ratio"] for run in runs] for k in args.kinds}
    # NOTE: every request of a refused kind is 4xx naming a field; every one of CONTROL is served.
    as_expected = {
        k: all(
            run["kinds"][k]["refused"]["all_refused_naming_a_field"] == (k != CONTROL)
            and (k != CONTROL or run["kinds"][k]["refused"]["statuses"].keys() == {"200"})
            for run in runs
        )
        for k in args.kinds
    }
    summary = {
        "host": host,
        "command": [
            "python",
            "bench/refused_cost.py",
            *(argv if argv is not None else sys.argv[1:]),
        ],
        "streams": args.streams,
        "clients": args.clients,
        "max_tokens": args.max_tokens,
        "max_model_len": MAX_MODEL_LEN,
        "target": TARGET,
        "runs": runs,
        "ratios": ratios,
        "answered_as_expected": as_expected,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    for kind in args.kinds:
        expected = "every one served" if kind == CONTROL else "every one refused naming a field"
        met = "met" if max(ratios[kind]) <= TARGET and as_expected[kind] else "not met"
        print(
            f"{kind:<19} ITL p99 beside / alone: "
            + ", ".join(f"{r:.2f}" for r in ratios[kind])
            + f"; {expected}: {as_expected[kind]} ({met}, target {TARGET})"
        )
    print(f"host: {describe(host)}; written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
