"""Delegation: a parent hands two sub-tasks to child agents at once. Each child runs in a
sandbox of its own, driven by a model behind any OpenAI-compatible chat-completions
endpoint, and spends from the parent's budget; only their summaries come back.

    OPENAI_API_KEY=... python examples/delegate.py
    OPENAI_BASE_URL=http://localhost:11434/v1 MODEL=qwen2.5-coder python examples/delegate.py

(BACKEND=docker runs each child in its own container.) The tests run this file against
a scripted stand-in server.
"""

from __future__ import annotations

import os

from hermes_sandbox import DelegationHost, OpenAIChatLoop, RunOptions

TASKS = [
    {"goal": "Which Python version does your sandbox run? Answer with the version only."},
    {
        "goal": "How many entries does PATH have in your sandbox? Answer with the number.",
        "context": "Use execute_code; the terminal tool runs shell commands.",
    },
]


def main() -> None:
    loop = OpenAIChatLoop(
        base_url=os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1"),
        model=os.environ.get("MODEL", "gpt-4o-mini"),
    )
    options = RunOptions(backend=os.environ.get("BACKEND", "local"), tools=["terminal"])
    # The parent's whole budget: 20 tool calls and 10 minutes for both children together.
    with DelegationHost(loop, options=options, max_tool_calls=20, timeout=600) as host:
        results = host.delegate_batch(TASKS)
        for task, result in zip(TASKS, results, strict=True):
            print(f"{task['goal']}\n  [{result.status}] {result.summary or result.error}")
        print(f"tool calls charged to the parent: {host.tool_calls_made}")


if __name__ == "__main__":
    main()
