"""The model host: an OpenAI-compatible chat-completions endpoint on the cluster's model
address. It answers ``answer N`` (N counts the requests; as a document of the request's JSON
schema when it asks for structured output), after the delay the prompt asks for
(``delay=S``), and appends one JSON line per request (time, prompt) to a log, which the checker
compares with the workers' call log.

    python -m tests.hosts.model_host ADDRESS PORT LOG"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from pathlib import Path

from bench.loopback import Answer, LoopbackServer, Request, json_answer
from bench.structured import answer_text

DELAY = re.compile(r"delay=([0-9.]+)")


class ModelHost(LoopbackServer):
    def __init__(self, host: str, port: int, log: Path) -> None:
        super().__init__(host, port)
        self.log = log
        self.count = 0
        self._lock = threading.Lock()

    def answer(self, request: Request) -> Answer:
        asked = json.loads(request.body)
        prompt = json.dumps(asked.get("messages", []))
        with self._lock:
            self.count += 1
            count = self.count
            with self.log.open("a") as out:
                out.write(json.dumps({"time": time.time(), "prompt": prompt}) + "\n")
        found = DELAY.search(prompt)
        return json_answer(200, {"model": "hosts-model", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": answer_text(asked, f"answer {count}")}}]},
            delay=float(found.group(1)) if found else 0.0)


def main(host: str, port: int, log: str) -> None:
    with ModelHost(host, port, Path(log)):
        print(f"model host listening on {host}:{port}", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
