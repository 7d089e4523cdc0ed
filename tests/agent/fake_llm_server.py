"""A local HTTP server that plays an LLM API for tests: OpenAI (chat, responses) and Anthropic.

Replies are queued in order with `add(...)`; every request is recorded (path, headers, JSON
body) so a test can assert on exactly what the SDK sent. Use it as a context manager:

    with FakeLLMServer() as server:
        server.add(chat_completion("hello"))
        cfg = ModelConfig(spec="openai:gpt-4.1", base_url=server.openai_url)
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Canned:
    status: int = 200
    body: dict | str = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: dict | None


class FakeLLMServer:
    """ThreadingHTTPServer on 127.0.0.1 with a random port, answering from a queue."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.max_in_flight = 0
        self.responder: Callable[[Recorded], dict] | None = None
        """When the queue is empty: the body to answer a request with, computed from it (a
        model that answers from its context alone, as a real one does)."""
        self._queue: list[Canned] = []
        self._lock = threading.Lock()
        self._in_flight = 0
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    @property
    def openai_url(self) -> str:
        return f"{self.url}/v1"

    def add(
        self,
        body: dict | str | None = None,
        *,
        status: int = 200,
        headers: dict[str, str] | None = None,
        delay_s: float = 0.0,
        times: int = 1,
    ) -> None:
        """Queue a reply (`times` copies). A str body is sent verbatim, e.g. broken JSON."""
        canned = Canned(status, body if body is not None else {}, headers or {}, delay_s)
        with self._lock:
            self._queue.extend([canned] * times)

    def error(self, status: int, message: str, *, code: str | None = None, **kw) -> None:
        """Queue an error in the shape both APIs use: {"error": {"type", "message", "code"}}."""
        self.add(
            {"type": "error", "error": {"type": "error", "message": message, "code": code}},
            status=status,
            **kw,
        )

    def __enter__(self) -> FakeLLMServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _next(self, recorded: Recorded) -> Canned:
        with self._lock:
            self.requests.append(recorded)
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
            if self._queue:
                return self._queue.pop(0)
            if self.responder is not None:
                return Canned(200, self.responder(recorded))
        # 418 is not retried by kloop, so a test that forgot a reply fails at once and says why
        return Canned(418, {"error": {"message": "fake server: no reply queued"}})

    def _done(self) -> None:
        with self._lock:
            self._in_flight -= 1


def _handler_for(server: FakeLLMServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            data = self.rfile.read(int(self.headers.get("content-length") or 0))
            try:
                body = json.loads(data) if data else None
            except ValueError:
                body = None
            headers = {k.lower(): v for k, v in self.headers.items()}
            canned = server._next(Recorded("POST", self.path, headers, body))
            done = False
            try:
                time.sleep(canned.delay_s)
                payload = canned.body if isinstance(canned.body, str) else json.dumps(canned.body)
                raw = payload.encode()
                self.send_response(canned.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                for k, v in canned.headers.items():
                    self.send_header(k, v)
                # No longer in flight before the client can have the whole response: counted
                # after the write, a client that got it and sent its next request at once was
                # seen as one request too many in flight (a busy 2-core host, 2026-12-05).
                server._done()
                done = True
                self.end_headers()
                self.wfile.write(raw)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test)
            finally:
                if not done:
                    server._done()

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


def chat_completion(
    text: str | None = "",
    *,
    reasoning_content: str | None = None,
    refusal: str | None = None,
    finish_reason: str = "stop",
    prompt_tokens: int = 10,
    completion_tokens: int = 20,
    reasoning_tokens: int = 0,
    cached_tokens: int = 0,
    model: str = "fake-model",
    tool_calls: list[tuple[str, str, dict]] | None = None,
) -> dict:
    """An OpenAI chat.completion body; `tool_calls` as (id, name, arguments) make it call tools."""
    message: dict = {"role": "assistant", "content": text, "refusal": refusal}
    if reasoning_content is not None:
        message["reasoning_content"] = reasoning_content
    if tool_calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for i, n, a in tool_calls]
        finish_reason = "tool_calls"
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
        },
    }


def responses_body(
    text: str = "",
    *,
    summary: list[str] | None = None,
    status: str = "completed",
    incomplete_reason: str | None = None,
    input_tokens: int = 10,
    output_tokens: int = 20,
    reasoning_tokens: int = 0,
    cached_tokens: int = 0,
    model: str = "fake-model",
    tool_calls: list[tuple[str, str, dict]] | None = None,
) -> dict:
    """An OpenAI Responses API body: an optional reasoning item, then the message, then a
    `function_call` item for each of `tool_calls` (id, name, arguments)."""
    output: list[dict] = []
    if summary is not None:
        output.append(
            {
                "id": "rs_1",
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": s} for s in summary],
            }
        )
    output.append(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
    )
    output += [{"id": f"fc_{i}", "type": "function_call", "call_id": i, "name": n,
                "arguments": json.dumps(a), "status": "completed"} for i, n, a in tool_calls or []]
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 0,
        "model": model,
        "status": status,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "output": output,
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": cached_tokens},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": input_tokens + output_tokens,
        },
    }


def anthropic_message(
    text: str = "",
    *,
    thinking: str | None = None,
    stop_reason: str = "end_turn",
    input_tokens: int = 10,
    output_tokens: int = 20,
    cache_read_tokens: int = 0,
    thinking_tokens: int | None = None,
    model: str = "fake-claude",
    tool_calls: list[tuple[str, str, dict]] | None = None,
) -> dict:
    """An Anthropic message body: an optional thinking block, then the text block, then a
    `tool_use` block for each of `tool_calls` (id, name, input)."""
    content: list[dict] = []
    if thinking is not None:
        content.append({"type": "thinking", "thinking": thinking, "signature": "sig"})
    content.append({"type": "text", "text": text})
    content += [{"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in tool_calls or []]
    if tool_calls:
        stop_reason = "tool_use"
    usage: dict = {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_read_input_tokens": cache_read_tokens,
        "cache_creation_input_tokens": 0,
    }
    if thinking_tokens is not None:
        usage["output_tokens_details"] = {"thinking_tokens": thinking_tokens}
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage,
    }
