"""A child's agent loop for any OpenAI-compatible chat-completions endpoint (OpenAI,
vLLM, Ollama, OpenRouter...), on httpx.

httpx is imported when a loop first runs, not with the package: it comes with the
``agent`` (or ``web``) extra, and without it the child fails with a message saying so.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import anyio

from hermes_sandbox.agent_loop import ChildTask, ChildToolbox
from hermes_sandbox.errors import AgentLoopError
from hermes_sandbox.tools import tool_error

DEFAULT_SYSTEM_PROMPT = (
    "You are a sub-agent working on one task for another agent. Use the tools to do it; "
    "prefer one execute_code script that chains many tool calls over many single calls. "
    "When done, answer with a short summary of what you found or did: it is all the "
    "other agent will see."
)
RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


def _httpx() -> Any:
    try:
        import httpx
    except ImportError:
        raise AgentLoopError(
            "OpenAIChatLoop needs httpx: pip install 'hermes-sandbox[agent]'"
        ) from None
    return httpx


class OpenAIChatLoop:
    """Drive a child with a model behind ``{base_url}/chat/completions``.

    The key is ``api_key``, else the variable ``api_key_env`` names (none is sent when
    it is unset: local servers need none). Each turn sends the conversation and the
    child's tools; every tool call the model makes is run through the toolbox and its
    result sent back, until the model answers without tool calls (the summary) or
    ``max_turns`` pass. A request that fails on the way (connection, a timeout of
    ``request_timeout`` seconds, HTTP 429 or 5xx, a body that is not a chat completion)
    is retried up to ``max_retries`` times, waiting ``backoff`` seconds doubling each
    time (or what Retry-After asks, up to ``max_backoff``). Raises
    :class:`AgentLoopError` when it cannot go on.
    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        max_turns: int = 20,
        request_timeout: float = 120.0,
        max_retries: int = 3,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        if not base_url:
            raise AgentLoopError("OpenAIChatLoop needs base_url, e.g. http://localhost:8000/v1")
        if not model:
            raise AgentLoopError("OpenAIChatLoop needs the model's name")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self._api_key = api_key if api_key is not None else os.environ.get(api_key_env)
        self.max_turns = max_turns
        self.request_timeout = request_timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.system_prompt = system_prompt
        self.extra_body = dict(extra_body or {})

    async def run(self, task: ChildTask, toolbox: ChildToolbox) -> str:
        httpx = _httpx()
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": task.prompt()},
        ]
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        async with httpx.AsyncClient(headers=headers, timeout=self.request_timeout) as client:
            for _ in range(self.max_turns):
                message = await self._complete(client, messages, task)
                calls = message.get("tool_calls") or []
                messages.append(
                    {"role": "assistant", "content": message.get("content"), "tool_calls": calls}
                    if calls
                    else {"role": "assistant", "content": message.get("content") or ""}
                )
                if not calls:
                    return str(message.get("content") or "")
                results = await self._run_calls(calls, toolbox)
                messages.extend(results)
        raise AgentLoopError(
            f"the model was still calling tools after {self.max_turns} turns; no summary"
        )

    async def _run_calls(self, calls: list[Any], toolbox: ChildToolbox) -> list[dict[str, Any]]:
        """Run a turn's tool calls at once; their results, in the calls' order."""
        results: list[dict[str, Any]] = [{} for _ in calls]

        async def run_one(index: int, call: Any) -> None:
            call_id, name, arguments = _parse_call(call, index)
            if name is None:
                content = tool_error("malformed tool call: it has no function name")
            else:
                content = await toolbox.call(name, arguments)
            results[index] = {"role": "tool", "tool_call_id": call_id, "content": content}

        async with anyio.create_task_group() as group:
            for index, call in enumerate(calls):
                group.start_soon(run_one, index, call)
        return results

    async def _complete(
        self, client: Any, messages: list[dict[str, Any]], task: ChildTask
    ) -> dict[str, Any]:
        """The model's next message, with retries; raises AgentLoopError."""
        httpx = _httpx()
        body = {"model": self.model, "messages": messages, **self.extra_body}
        if task.tools:
            body["tools"] = list(task.tools)
        problem = ""
        for attempt in range(self.max_retries + 1):
            wait = min(self.backoff * 2**attempt, self.max_backoff)
            try:
                response = await client.post(self.url, json=body)
            except httpx.TimeoutException:
                problem = f"no answer within {self.request_timeout:g} s"
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code in RETRY_STATUSES:
                    problem = f"HTTP {response.status_code}: {response.text[:200]}"
                    wait = _retry_after(response, wait, self.max_backoff)
                elif response.status_code >= 400:
                    raise AgentLoopError(
                        f"the endpoint refused the request: HTTP {response.status_code}: "
                        f"{response.text[:300]}"
                    )
                else:
                    message = _message(response)
                    if isinstance(message, dict):
                        return message
                    problem = message
            if attempt < self.max_retries:
                await anyio.sleep(wait)
        raise AgentLoopError(
            f"the model endpoint {self.url} failed {self.max_retries + 1} times; last: {problem}"
        )


def _message(response: Any) -> dict[str, Any] | str:
    """The assistant message of a chat completion, or what is wrong with the body."""
    try:
        data = response.json()
    except ValueError:
        return f"the answer is not JSON: {response.text[:200]!r}"
    try:
        message = data["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        return f"the answer is not a chat completion: {json.dumps(data)[:200]}"
    if not isinstance(message, dict):
        return "the answer's message is not an object"
    calls = message.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        return "the answer's tool_calls is not a list"
    return message


def _parse_call(call: Any, index: int) -> tuple[str, str | None, Any]:
    """(id, name, arguments) of one tool call, None for a name that is missing."""
    if not isinstance(call, dict):
        return f"call_{index}", None, None
    call_id = str(call.get("id") or f"call_{index}")
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return call_id, None, None
    return call_id, function["name"], function.get("arguments")


def _retry_after(response: Any, default: float, cap: float) -> float:
    value = response.headers.get("retry-after")
    try:
        return min(max(float(value), 0.0), cap) if value is not None else default
    except ValueError:
        return default


__all__ = ["DEFAULT_SYSTEM_PROMPT", "OpenAIChatLoop"]
