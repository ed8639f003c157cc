"""An agent loop: a model gets the execute_code tool, whose scripts can call a tool of the
host's own (get_weather) beside the built-in ones; the loop runs each tool call the model
makes and hands the result JSON back, until the model answers.

Run it against any OpenAI-compatible chat completions endpoint:

    OPENAI_API_KEY=... python examples/agent_loop.py "Is it warmer in Lyon or Oslo today?"

(OPENAI_BASE_URL and MODEL pick another endpoint and model.) ``agent_loop`` takes the
model as a function of (messages, tools) that returns the assistant's message, so any
client fits; the tests drive this file against a scripted stand-in server.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request

from hermes_sandbox import register_execute_code, registry, tool, tool_error


@tool(toolset="weather")
def get_weather(city: str) -> dict:
    """Today's weather in a city. Returns {city, forecast, high_c}.

    Args:
        city: the city's name, e.g. "Lyon"
    """
    forecast, high = {"lyon": ("sunny", 24), "oslo": ("rain", 11)}.get(city.lower(), ("fog", 9))
    return {"city": city, "forecast": forecast, "high_c": high}


entry = register_execute_code(enabled_tools=["get_weather", "read_file", "terminal"])
TOOLS = [entry.schema]  # {"type": "function", "function": {name, description, parameters}}


def agent_loop(model, task, max_turns=10):
    """model(messages, tools) -> the assistant's next message (OpenAI chat format)."""
    messages = [{"role": "user", "content": task}]
    for _ in range(max_turns):
        reply = model(messages, TOOLS)
        messages.append(reply)
        if not reply.get("tool_calls"):
            return reply["content"]
        for call in reply["tool_calls"]:
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            if name == "execute_code":
                result = registry.dispatch(name, arguments)  # the result JSON, as text
            else:
                result = tool_error(f"no tool {name!r} here; call execute_code")
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return "(no answer: the model kept calling tools)"


def chat_completions_model(messages, tools):
    """The assistant's next message from an OpenAI-compatible endpoint (stdlib only)."""
    base_url = os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1").rstrip("/")
    body = {"model": os.environ.get("MODEL", "gpt-4o-mini"), "messages": messages, "tools": tools}
    request = urllib.request.Request(
        base_url + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}",
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.load(response)["choices"][0]["message"]


if __name__ == "__main__":
    if not os.environ.get("OPENAI_API_KEY"):
        sys.exit("agent_loop.py: set OPENAI_API_KEY (and OPENAI_BASE_URL for another endpoint)")
    task = " ".join(sys.argv[1:]) or "Is it warmer in Lyon or Oslo today?"
    print(agent_loop(chat_completions_model, task))
