"""One trace per message, with the SDK: an agent turn (ADK InMemoryRunner, the callbacks,
the stand-in model) under an in-memory exporter, then a worker process of its own with a
provider that writes its spans as JSON lines; checks that the worker's persist span links
to each enqueue span, and that no span attribute, event, link attribute or status holds
any word the user said (the MARK words) or their ids.

Usage: python trace_content.py  (needs REDIS_URL etc. of a deployment; starts its own
worker with another key prefix so the running one does not take the messages)."""

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

PREFIX = "b26btr" + uuid.uuid4().hex[:4]
os.environ["AFTERTHOUGHT_KEY_PREFIX"] = PREFIX
os.environ["AFTERTHOUGHT_LOCAL_DB_PATH"] = f"/tmp/b26b/{PREFIX}.sqlite3"
SPANS = f"/tmp/b26b/{PREFIX}-worker-spans.jsonl"
WORKER = f"""
import json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
class ToFile(SpanExporter):
    def export(self, spans):
        with open({SPANS!r}, "a") as out:
            for s in spans:
                out.write(s.to_json(indent=None) + "\\n")
        return SpanExportResult.SUCCESS
p = TracerProvider()
p.add_span_processor(SimpleSpanProcessor(ToFile()))
trace.set_tracer_provider(p)
from afterthought.cli import main
sys.exit(main(["worker"]))
"""
MARKS = ["PERIWINKLE", "Lisbon", "zanzibar"]
USER = "tracey" + uuid.uuid4().hex[:4]
SESSION_IDS: list[str] = []

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)


async def turns() -> None:
    from google.adk.agents import LlmAgent
    from google.adk.runners import InMemoryRunner
    from google.genai import types

    from afterthought.agent_hooks import create_callbacks
    from afterthought.testing import StandInLlm

    memory = create_callbacks()
    agent = LlmAgent(
        name="assistant",
        model=StandInLlm(),
        before_model_callback=memory.before_model_callback,
        after_model_callback=memory.after_model_callback,
    )
    runner = InMemoryRunner(agent=agent, app_name="traced")
    for text in ["my code word is PERIWINKLE, we moved to Lisbon", "I collect zanzibar stamps"]:
        s = await runner.session_service.create_session(app_name="traced", user_id=USER)
        SESSION_IDS.append(s.id)
        async for _ in runner.run_async(
            user_id=USER, session_id=s.id, new_message=types.UserContent(text)
        ):
            pass
    await memory.aclose() if hasattr(memory, "aclose") else None


def words_in(obj: object) -> list[str]:
    blob = json.dumps(obj, default=str)
    return [w for w in [*MARKS, USER, *SESSION_IDS] if w in blob]


asyncio.run(turns())
agent_spans = [json.loads(s.to_json(indent=None)) for s in exporter.get_finished_spans()]
enq = [s for s in agent_spans if s["name"] == "afterthought.enqueue"]
ours = [s for s in agent_spans if s["name"].startswith("afterthought")]
print("agent spans:", len(agent_spans), "enqueue:", len(enq))
worker = subprocess.Popen(
    [sys.executable, "-c", WORKER],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
)
try:
    for _ in range(40):
        time.sleep(0.5)
        if (
            os.path.exists(SPANS)
            and sum("afterthought.persist" in x for x in Path(SPANS).read_text().splitlines()) >= 1
        ):
            time.sleep(3)
            break
finally:
    worker.terminate()
    worker.wait(10)
wspans = (
    [json.loads(x) for x in Path(SPANS).read_text().splitlines()] if os.path.exists(SPANS) else []
)
persist = [s for s in wspans if s["name"] == "afterthought.persist"]
print("worker spans:", len(wspans), "persist:", len(persist))
linked = {x["context"]["span_id"] for s in persist for x in s.get("links", [])}
enq_ids = {s["context"]["span_id"] for s in enq}
print("enqueue spans linked from a persist span:", len(enq_ids & linked), "of", len(enq_ids))
for s in persist:
    for link in s.get("links", []):
        print("  link attrs:", link.get("attributes"))
    print("  persist attrs:", s["attributes"])
for s in enq[:1]:
    print("  enqueue attrs:", s["attributes"], "parent:", bool(s.get("parent_id")))
bad = []
for s in ours + [w for w in wspans if w["name"].startswith("afterthought")]:
    found = words_in({k: s.get(k) for k in ("attributes", "events", "links", "status", "name")})
    if found:
        bad.append((s["name"], found))
print("our spans with content or ids:", bad or "none")
# every span of the worker process, whoever made it (arq? redis instrumentation?)
print(
    "any worker span with content:",
    [(w["name"], words_in(w)) for w in wspans if words_in(w)] or "none",
)
# ADK's own spans of the same turns (not ours: what an operator's exporter also receives)
print(
    "ADK spans with content:",
    sorted(
        {s["name"] for s in agent_spans if not s["name"].startswith("afterthought") and words_in(s)}
    )
    or "none",
)
