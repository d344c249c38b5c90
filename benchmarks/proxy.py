"""``make bench``: what ``ragent-memory serve`` adds to a model call, side by side in one run.

One simulated RAG session (the demo's, 300 turns, B = 200,000): at every turn the app sends its
whole history (217 bytes to 2.2 MB of JSON) to every arm, each over its own keep-alive HTTP
client, the arms in rotating order, then keeps the reply and goes on with the demo's tool loop:

- **direct**: to a fast local OpenAI-compatible upstream (a fixed reply, no model), and
- four **proxy** arms: a real ``ragent-memory serve`` subprocess each, in front of that same
  upstream — default settings (the offline summarizer; ``prepare`` runs in a worker thread on
  the turns where it may wait up to ``compaction_timeout_s`` for a compaction, on the event
  loop on the others); defaults with recall off;
  ``compaction_timeout_s: 0`` (``prepare`` never waits: a compaction is adopted on a later
  turn); and that with recall off.

**Added latency** of a request, the issue's figure: the app's wall time through a proxy arm
minus its wall time for the same body direct to the same upstream, measured back to back in
the same turn. The upstream's own time cancels out (the proxy forwards the prepared view, at
most B chars, so the upstream reads less through the proxy than direct — that saving counts
in the proxy's favour). It includes everything the app waits for extra: the second HTTP hop,
reading and parsing the body, ``prepare``, forwarding, relaying the reply. Two parts of it are
reported as well: ``prepare``'s own time (``X-Ragent-Duration-Ms``: the engine, which an app
calling the library pays too) and "added − prepare" (what the proxy itself costs). "Inside the
proxy" is ``X-Ragent-Proxy-Ms``: the handler's time, upstream wait excluded.

Before each timed request the benchmark waits (at most 0.5 s) until none of its processes is
using CPU: otherwise one arm's background work (``after_turn``, compaction) would run on the
same two cores while another arm is timed. An arm's own background work from its previous
turn has ended by then as well (four other requests came in between), as it has for an app
whose turns are a model call apart.
The machine is shared, so the load average before and after is printed and stored, and the
event-loop thread's CPU time per request (schedstat, nanoseconds) is reported for the relay
and every proxy: it moves far less with the load than wall times do.
**The other wire formats** (issue 33): the same session, at every turn, as an Anthropic
Messages body (``/v1/messages``: system top-level, tool_use / tool_result blocks) and as a
stateless OpenAI Responses body (``/v1/responses``: function_call / function_call_output items),
each sent direct, through the bare relay (the same bytes) and through the default proxy arm
(its own session per format); the upstream answers each in its own format.

Run: ``python -m benchmarks.proxy [--turns N] [--against CHECKOUT] [--formats LIST]``; results
go to ``benchmarks/results/proxy.json``. ``--against`` runs every proxy arm again from the
package in another checkout (say the last release's), so before and after share one run's load
(each other format is timed through its default arm too).
``--formats messages,responses`` runs only those formats' rows (the default proxy arm alone) and
keeps the chat-completions results already in the file.
The target (docs/design.md §17 measures ratios, not absolute times): added p50 ≤ 2 × the bare relay's,
for every format.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx2
import uvloop

from ragent_memory.cli.demo import simulate_session

BUDGET = 200_000
TARGET_RELAY_RATIO = 2.0  # added p50 ≤ this × the bare relay's added p50
FORMATS = ("chat", "messages", "responses")
ANSWER = "Noted; here is the answer."
RESULTS = Path(__file__).resolve().parent / "results" / "proxy.json"
READY = re.compile(r"ragent-memory serve: (http://\S+/v1) ")
REPLY = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "bench",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": ANSWER},
                "finish_reason": "stop",
            }
        ],
    }
).encode()
MESSAGES_REPLY = json.dumps(
    {
        "id": "msg_bench",
        "type": "message",
        "role": "assistant",
        "model": "bench",
        "content": [{"type": "text", "text": ANSWER}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }
).encode()
RESPONSES_REPLY = json.dumps(
    {
        "id": "resp_bench",
        "object": "response",
        "created_at": 0,
        "status": "completed",
        "model": "bench",
        "output": [
            {
                "type": "message",
                "id": "msg_bench",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": ANSWER, "annotations": []}],
            }
        ],
    }
).encode()


# ---------------------------------------------------------------------- the fast upstream


class _Upstream(asyncio.Protocol):
    """HTTP/1.1 keep-alive, any POST answered with REPLY once its body has arrived."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.buffer = bytearray()  # appended in place: a 2 MB body costs its size, once
        self.need = 0  # bytes of the request being read (head + body); 0: head not seen yet
        self.post = False
        self.reply = REPLY  # the one in the format of the request being read

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            if not self.need:
                end = self.buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(self.buffer[:end]).decode("latin-1").lower()
                found = re.search(r"content-length:\s*(\d+)", head)
                self.need = end + 4 + (int(found.group(1)) if found else 0)
                self.post = head.startswith("post")
                self.reply = _reply_for(head)
            if len(self.buffer) < self.need:
                return
            del self.buffer[: self.need]
            self.need = 0
            body = self.reply if self.post else b'{"object":"list","data":[]}'
            self.transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body
            )


def _reply_for(head: str) -> bytes:
    """The reply in the format of the request whose (lower-cased) head is ``head``."""
    if head.startswith("post /v1/messages"):
        return MESSAGES_REPLY
    if head.startswith("post /v1/responses"):
        return RESPONSES_REPLY
    return REPLY


def serve_upstream() -> None:
    """Run the fast upstream on a free port until killed; print the port first."""

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(_Upstream, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        await server.serve_forever()

    asyncio.run(main())


def serve_relay(port: int) -> None:
    """A bare TCP relay to the upstream on ``port`` (bytes both ways, nothing parsed): the
    floor any proxy pays for its extra hop, on this machine, under this load."""

    async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(1 << 16):
                sink.write(data)
                await sink.drain()
        finally:
            sink.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        await server.serve_forever()

    uvloop.run(main())  # the proxy's loop too


# ---------------------------------------------------------------------- processes


def start(
    args: list[str], ready: re.Pattern[str] | None, cwd: Path, env: dict[str, str] | None = None
) -> tuple[Any, str]:
    """A subprocess and the first match of ``ready`` on stderr (or its first stdout line)."""
    process = subprocess.Popen(
        args,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    found: list[str] = []
    event = threading.Event()

    def read(stream: Any, pattern: re.Pattern[str] | None) -> None:
        for line in stream:
            match = pattern.search(line) if pattern else None
            if not found and (match or pattern is None):
                found.append(match.group(1) if match else line.strip())
                event.set()
        event.set()

    stream = process.stdout if ready is None else process.stderr
    other = process.stderr if ready is None else process.stdout
    threading.Thread(target=read, args=(stream, ready), daemon=True).start()
    threading.Thread(target=read, args=(other, re.compile(r"(?!x)x")), daemon=True).start()
    if not event.wait(60) or not found:
        process.kill()
        raise RuntimeError(f"{args[:4]} did not start")
    return process, found[0]


def stop(process: Any) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(30)


# ---------------------------------------------------------------------- the measurement


def post(client: httpx2.Client, url: str, body: bytes, headers: dict[str, str]) -> Any:
    """``(ms, headers, reply JSON)`` of one timed POST."""
    started = time.perf_counter()
    try:
        response = client.post(url, content=body, headers=headers)
    except httpx2.RemoteProtocolError:
        # the server closed the kept-alive connection while it sat idle (uvicorn does after
        # 5 s, which a turn can take when settle() waits): timed again on a new connection
        started = time.perf_counter()
        response = client.post(url, content=body, headers=headers)
    elapsed = (time.perf_counter() - started) * 1000
    response.raise_for_status()
    return elapsed, response.headers, response.json()


# ---------------------------------------------------------------------- the other formats


def as_messages(history: list[dict[str, Any]]) -> dict[str, Any]:
    """The app's chat history as an Anthropic Messages body (what Claude Code would send)."""
    turns: list[dict[str, Any]] = []
    for message in history[1:]:
        if message["role"] == "user":
            turns.append({"role": "user", "content": message["content"]})
        elif message["role"] == "assistant":
            blocks = (
                [{"type": "text", "text": message["content"]}] if message.get("content") else []
            )
            for call in message.get("tool_calls") or ():
                function = call["function"]
                arguments = json.loads(function["arguments"] or "{}")
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call["id"],
                        "name": function["name"],
                        "input": arguments,
                    }
                )
            turns.append({"role": "assistant", "content": blocks})
        else:
            result = {
                "type": "tool_result",
                "tool_use_id": message["tool_call_id"],
                "content": message["content"],
            }
            if turns[-1]["role"] == "user" and isinstance(turns[-1]["content"], list):
                turns[-1]["content"].append(result)
            else:
                turns.append({"role": "user", "content": [result]})
    return {
        "model": "bench",
        "max_tokens": 1024,
        "system": history[0]["content"],
        "messages": turns,
    }


def as_responses(history: list[dict[str, Any]]) -> dict[str, Any]:
    """The app's chat history as a stateless Responses body (what Codex CLI would send)."""
    items: list[dict[str, Any]] = []
    for message in history[1:]:
        if message["role"] == "user":
            items.append({"role": "user", "content": message["content"]})
        elif message["role"] == "assistant":
            if message.get("content") == ANSWER:  # the upstream's reply, kept as received
                items += json.loads(RESPONSES_REPLY)["output"]
            elif message.get("content"):
                text = {"type": "output_text", "text": message["content"], "annotations": []}
                items.append({"type": "message", "role": "assistant", "content": [text]})
            for call in message.get("tool_calls") or ():
                function = call["function"]
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call["id"],
                        "name": function["name"],
                        "arguments": function["arguments"],
                    }
                )
        else:
            output = {"call_id": message["tool_call_id"], "output": message["content"]}
            items.append({"type": "function_call_output", **output})
    body = {"model": "bench", "instructions": history[0]["content"], "input": items}
    return {**body, "store": False}


CONVERT = {"messages": as_messages, "responses": as_responses}


def time_format(
    fmt: str,
    number: int,
    history: list[dict[str, Any]],
    targets: dict[str, tuple[httpx2.Client, str]],
    processes: Any,
    rows: dict[str, list[float]],
) -> int:
    """One turn of ``fmt``: the same body direct, through the relay and through the proxy,
    in rotating order; the rows it adds to; the body's size."""
    body = json.dumps(CONVERT[fmt](history)).encode()
    headers = {
        "Authorization": "Bearer sk-bench",
        "Content-Type": "application/json",
        "X-Session-Id": f"bench-{fmt}",
        "X-User-Id": "bench-user",
    }
    order = list(targets)
    shift = number % len(order)
    timed = {}
    for name in order[shift:] + order[:shift]:
        settle(processes)
        client, base = targets[name]
        timed[name] = post(client, f"{base}/{fmt}", body, headers)
    direct = timed["direct"][0]
    rows[f"{fmt}: direct"].append(direct)
    rows[f"{fmt}: bare TCP relay: added"].append(timed["bare TCP relay"][0] - direct)
    for name in order[2:]:  # the default proxy arm (and, with --against, the other one's)
        elapsed, got, _ = timed[name]
        prepare = float(got["x-ragent-duration-ms"])
        rows[f"{fmt}: {name}: added"].append(elapsed - direct)
        rows[f"{fmt}: {name}: inside"].append(float(got["x-ragent-proxy-ms"]))
        rows[f"{fmt}: {name}: prepare"].append(prepare)
        rows[f"{fmt}: {name}: own"].append(elapsed - direct - prepare)
    return len(body)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# name → config keys on top of B and the store; each arm is its own proxy process in front
# of the same upstream.
ARMS: dict[str, dict[str, Any]] = {
    "proxy": {},
    "proxy, recall off": {"recall_enabled": False},
    "proxy, compaction_timeout_s: 0": {"compaction_timeout_s": 0},
    "proxy, compaction_timeout_s: 0, recall off": {
        "compaction_timeout_s": 0,
        "recall_enabled": False,
    },
}


def measure(
    turns: int, cwd: Path, arms: dict[str, tuple[dict[str, Any], Any]], formats: tuple[str, ...]
) -> dict[str, Any]:
    root = Path(__file__).resolve().parent.parent
    upstream, port = start([sys.executable, "-m", "benchmarks.proxy", "--upstream"], None, root)
    upstream_url = f"http://127.0.0.1:{port}/v1"
    relay, relay_port = start(
        [sys.executable, "-m", "benchmarks.proxy", "--relay", port], None, root
    )
    proxies: dict[str, tuple[Any, str]] = {}
    rows: dict[str, list[float]] = {
        "direct": [],
        "bare TCP relay: total": [],
        "bare TCP relay: added": [],
        "bare TCP relay: loop cpu": [],
    }
    headers = {
        "Authorization": "Bearer sk-bench",
        "Content-Type": "application/json",
        "X-Session-Id": "bench",
        "X-User-Id": "bench-user",
    }
    others = [fmt for fmt in formats if fmt != "chat"]
    timed_arms = [name for name in arms if name == "proxy" or name.startswith("proxy [")]
    for fmt in others:
        rows[f"{fmt}: direct"], rows[f"{fmt}: bare TCP relay: added"] = [], []
        for name, kind in itertools.product(timed_arms, ("added", "inside", "prepare", "own")):
            rows[f"{fmt}: {name}: {kind}"] = []
    sizes: list[int] = []
    format_sizes: dict[str, list[int]] = {fmt: [] for fmt in others}
    clients: dict[str, httpx2.Client] = {}
    try:
        for number, (name, (extra, env)) in enumerate(arms.items()):
            config = cwd / f"proxy{number}.yaml"
            store = {"path": str(cwd / f"proxy{number}.db")}
            config.write_text(json.dumps({**extra, "context_window_chars": BUDGET, "store": store}))
            args = [sys.executable, "-m", "ragent_memory", "serve", "--config", str(config)]
            args += ["--upstream", upstream_url, "--port", "0"]
            proxies[name] = start(args, READY, cwd, env)
            for kind in ("total", "added", "inside", "prepare", "own", "loop cpu"):
                rows[f"{name}: {kind}"] = []
        urls = {"direct": upstream_url, "bare TCP relay": f"http://127.0.0.1:{relay_port}/v1"}
        urls |= {name: url for name, (_, url) in proxies.items()}
        clients = {name: httpx2.Client(timeout=60) for name in urls}
        processes = {"upstream": upstream, "bare TCP relay": relay}
        processes |= {name: process for name, (process, _) in proxies.items()}
        cpu_before = {name: cpu_ms(process.pid) for name, process in processes.items()}
        history: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a support agent for ACME."}
        ]
        targets = {
            name: (clients[name], urls[name]) for name in ["direct", "bare TCP relay", *timed_arms]
        }
        for number, messages in enumerate(simulate_session(turns)):
            history.append(messages[0])
            for fmt in others:
                size = time_format(fmt, number, history, targets, processes.values(), rows)
                format_sizes[fmt].append(size)
            if "chat" not in formats:
                history += [{"role": "assistant", "content": ANSWER}, *messages[1:]]
                continue
            body = json.dumps({"model": "bench", "messages": history}).encode()
            order = list(urls)
            shift = number % len(order)  # each arm goes first in turn
            timed = {}
            for name in order[shift:] + order[:shift]:
                settle(processes.values())
                process = processes.get(name)
                before = loop_cpu_ms(process.pid) if process else None
                timed[name] = post(clients[name], urls[name] + "/chat/completions", body, headers)
                after = loop_cpu_ms(process.pid) if process else None
                if before is not None and after is not None:
                    rows[f"{name}: loop cpu"].append(after - before)
            direct = timed["direct"][0]
            rows["direct"].append(direct)
            rows["bare TCP relay: total"].append(timed["bare TCP relay"][0])
            rows["bare TCP relay: added"].append(timed["bare TCP relay"][0] - direct)
            for name in proxies:
                elapsed, got, _ = timed[name]
                prepare = float(got["x-ragent-duration-ms"])
                rows[f"{name}: total"].append(elapsed)
                rows[f"{name}: added"].append(elapsed - direct)
                rows[f"{name}: inside"].append(float(got["x-ragent-proxy-ms"]))
                rows[f"{name}: prepare"].append(prepare)
                rows[f"{name}: own"].append(elapsed - direct - prepare)
            sizes.append(len(body))
            # The app keeps the reply it got, then its tool loop goes on (the demo's).
            history.append(timed["proxy"][2]["choices"][0]["message"])
            history.extend(messages[1:])
        chat = turns if "chat" in formats else 0
        served = {name: chat for name in processes}
        for name in ("bare TCP relay", *timed_arms):
            served[name] += turns * len(others)
        served["upstream"] = chat * (len(urls) - 1) + len(targets) * turns * len(others)
        cpu = {
            name: round((cpu_ms(process.pid) - cpu_before[name]) / max(served[name], 1), 3)
            for name, process in processes.items()
        }
    finally:
        for client in clients.values():
            client.close()
        for process, _ in proxies.values():
            stop(process)
        stop(relay)
        stop(upstream)
    return {
        "rows": rows,
        "body_bytes": sizes,
        "format_bytes": format_sizes,
        "cpu_ms_per_request": cpu,
    }


def busy_ms(pid: int) -> float:
    """CPU time every thread of ``pid`` has used so far (Linux schedstat, nanoseconds)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that just ended
    return total / 1e6


def settle(processes: Any, quiet_ms: float = 0.05, most_s: float = 0.5) -> None:
    """Wait (at most ``most_s``) until none of the benchmark's processes is still working,
    so one arm's request is not timed while another arm's background work (after_turn,
    compaction) runs on the same two cores. An arm's own background work from its last
    turn has long ended by then too: four other requests came in between."""
    pids = [process.pid for process in processes]
    deadline = time.monotonic() + most_s
    last = sum(busy_ms(pid) for pid in pids)
    while time.monotonic() < deadline:
        time.sleep(0.002)
        now = sum(busy_ms(pid) for pid in pids)
        if now - last < quiet_ms:
            return
        last = now


def loop_cpu_ms(pid: int) -> float | None:
    """CPU time the main thread of ``pid`` (the event loop) has used so far, at nanosecond
    resolution (Linux schedstat); None where the kernel does not keep it."""
    try:
        return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0]) / 1e6
    except (OSError, ValueError, IndexError):
        return None


def cpu_ms(pid: int) -> float:
    """CPU time a process has used so far, all its threads, user + system (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def summarize(rows: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {
        name: {
            "p50_ms": round(statistics.median(values), 3),
            "p99_ms": round(pct(values, 0.99), 3),
            "late_p50_ms": round(statistics.median(values[-100:]), 3),
        }
        for name, values in rows.items()
        if values
    }


LABELS = {
    "total": "app → this → upstream",
    "added": "added (proxy − direct)",
    "inside": "inside the proxy, upstream wait excluded",
    "prepare": "of which prepare() (the engine)",
    "own": "added − prepare (the proxy's own)",
    "loop cpu": "event-loop thread CPU per request",
}


def arms_for(against: Path | None) -> dict[str, tuple[dict[str, Any], Any]]:
    """The proxy arms (config, environment); with ``against``, each again as run from the
    package in that checkout, named with its commit: before and after in one run."""
    arms: dict[str, tuple[dict[str, Any], Any]] = {
        name: (extra, None) for name, extra in ARMS.items()
    }
    if against is not None:
        commit = subprocess.run(
            ["git", "-C", str(against), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        env = {**os.environ, "PYTHONPATH": str(against.resolve())}
        arms |= {f"{name} [{commit}]": (extra, env) for name, extra in ARMS.items()}
    return arms


def print_chat(stats: dict[str, dict[str, float]], cpu: dict[str, float]) -> dict[str, bool]:
    """The chat-completions arms' table; each arm's verdict against the relay."""
    print(f"{'':<52} {'p50 ms':>8} {'p99 ms':>8} {'last-100 p50':>13}")
    for name, row in stats.items():
        arm, _, kind = name.rpartition(": ")
        if arm.split(": ")[0] in CONVERT:
            continue
        if kind == "total":
            print(f"\n{arm}")
        label = f"  {LABELS[kind]}" if arm else "direct call (app → upstream)"
        print(
            f"{label:<52} {row['p50_ms']:>8.3f} {row['p99_ms']:>8.3f} {row['late_p50_ms']:>13.3f}"
        )
    print(
        "\nCPU time per request (every thread of the process, background work included; "
        "10 ms ticks, so a mean over the run; less load-dependent than wall time):"
    )
    for name, value in cpu.items():
        print(f"  {name:<50} {value:>8.3f} ms")
    relay = stats["bare TCP relay: added"]["p50_ms"]
    return {
        f"{arm}: added": stats[f"{arm}: added"]["p50_ms"] <= TARGET_RELAY_RATIO * relay
        for arm in ARMS
    }


def print_formats(stats: dict[str, dict[str, float]], formats: list[str]) -> dict[str, bool]:
    """Each other format's rows (direct, relay, the default proxy); its verdict."""
    verdicts = {}
    for fmt in formats:
        relay = stats[f"{fmt}: bare TCP relay: added"]["p50_ms"]
        added = stats[f"{fmt}: proxy: added"]["p50_ms"]
        print(f"\n/v1/{fmt}: the same session in that format, default proxy")
        arms = [
            k.removesuffix(": added")
            for k in stats
            if k.startswith(f"{fmt}: proxy") and k.endswith(": added")
        ]
        kinds = [f"{arm.removeprefix(f'{fmt}: ')}: {kind}" for arm in arms for kind in PARTS]
        for kind in ("direct", "bare TCP relay: added", *kinds):
            row = stats[f"{fmt}: {kind}"]
            print(
                f"  {kind:<50} {row['p50_ms']:>8.3f} {row['p99_ms']:>8.3f} {row['late_p50_ms']:>13.3f}"
            )
        for arm in arms:
            ratio = stats[f"{arm}: added"]["p50_ms"] / relay
            print(
                f"  {arm.removeprefix(f'{fmt}: ') + ': added p50 ÷ relay added p50':<50} {ratio:>8.2f}"
            )
        verdicts[f"{fmt}: proxy: added"] = added <= TARGET_RELAY_RATIO * relay
    return verdicts


PARTS = ("added", "prepare", "own")


def save(data: dict[str, Any], formats: tuple[str, ...]) -> None:
    """``data`` to RESULTS; a run without chat keeps the chat rows already there."""
    if "chat" not in formats and RESULTS.exists():
        kept = json.loads(RESULTS.read_text())
        kept["formats"] = {**kept.get("formats", {}), **data["formats"]}
        data = kept
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument(
        "--against",
        type=Path,
        help="also run every proxy arm from the package in this checkout (before/after in one run)",
    )
    parser.add_argument(
        "--formats",
        default=",".join(FORMATS),
        help="wire formats to time, of chat,messages,responses (default: all three)",
    )
    parser.add_argument("--upstream", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--relay", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.upstream:
        serve_upstream()
        return
    if args.relay:
        serve_relay(args.relay)
        return
    formats = tuple(f for f in FORMATS if f in args.formats.split(","))
    others = [f for f in formats if f != "chat"]
    arms = arms_for(args.against) if "chat" in formats else {"proxy": ({}, None)}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        measured = measure(args.turns, Path(tmp), arms, formats)
    load_after = os.getloadavg()
    stats = summarize(measured["rows"])
    sizes = measured["body_bytes"] or measured["format_bytes"][others[0]]
    print(
        f"ragent-memory serve, {args.turns} turns of the demo RAG session, B = {BUDGET:,}; "
        f"request bodies {min(sizes):,}–{max(sizes):,} bytes; {os.cpu_count()} cores; "
        f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after\n"
    )
    verdicts = print_chat(stats, measured["cpu_ms_per_request"]) if "chat" in formats else {}
    verdicts |= print_formats(stats, others)
    print(f"\ntarget: added p50 ≤ {TARGET_RELAY_RATIO:g} × the bare relay's added p50")
    for name, met in verdicts.items():
        print(f"  {name}: p50 {stats[name]['p50_ms']:.3f} ms {'meets' if met else 'misses'} it")
    command = f"python -m benchmarks.proxy --turns {args.turns}"
    format_data = {
        fmt: {
            "command": f"{command} --formats {fmt}" if "chat" not in formats else command,
            "load_average": {"before": load_before[0], "after": load_after[0]},
            "body_bytes": {
                "min": min(measured["format_bytes"][fmt]),
                "max": max(measured["format_bytes"][fmt]),
            },
            "stats": {
                k.removeprefix(f"{fmt}: "): v for k, v in stats.items() if k.startswith(f"{fmt}: ")
            },
            "meets_target": verdicts[f"{fmt}: proxy: added"],
        }
        for fmt in others
    }
    chat_stats = {k: v for k, v in stats.items() if k.split(": ")[0] not in CONVERT}
    save(
        {
            "benchmark": "proxy",
            "command": command,
            "turns": args.turns,
            "context_window_chars": BUDGET,
            "cores": os.cpu_count(),
            "load_average": {"before": load_before[0], "after": load_after[0]},
            "arms": {
                "direct": {},
                "bare TCP relay": {},
                **{n: extra for n, (extra, _) in arms.items()},
            },
            "body_bytes": {"min": min(sizes), "max": max(sizes)},
            "stats": chat_stats,
            "cpu_ms_per_request": measured["cpu_ms_per_request"],
            "target_relay_ratio": TARGET_RELAY_RATIO,
            "meets_target": {k: v for k, v in verdicts.items() if k.split(": ")[0] not in CONVERT},
            "formats": format_data,
        },
        formats,
    )
    print(f"→ {RESULTS.relative_to(Path.cwd()) if RESULTS.is_relative_to(Path.cwd()) else RESULTS}")


if __name__ == "__main__":
    main()
