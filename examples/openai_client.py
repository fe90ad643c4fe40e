"""Stream a chat completion from `loosespec serve` with the official openai client.

    loosespec serve &                       # default pair, on http://127.0.0.1:8000
    python examples/openai_client.py --method fly "Write quicksort in Python."

Prints the streamed text, then the response's speculative-decoding metrics (vLLM's field names
plus loosespec's counters) and the usage chunk.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from openai import OpenAI


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("prompt", nargs="?", default="Write a Python function that checks whether a number is prime.")
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--api-key", default="unused")
    ap.add_argument("--method", default="fly", help="loosespec method sent in extra_body (fly is LOSSY)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--wait", type=float, default=0.0, help="wait up to this many seconds for the server")
    args = ap.parse_args()

    client = OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0)
    deadline = time.time() + args.wait
    while True:
        try:
            model = client.models.list().data[0].id
            break
        except Exception as e:  # the server may still be loading its models
            if time.time() > deadline:
                print(f"no server at {args.base_url}: {e}", file=sys.stderr)
                return 1
            time.sleep(2)
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": args.prompt}],
        max_tokens=args.max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"method": args.method},
    )
    metrics = usage = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            sys.stdout.write(chunk.choices[0].delta.content)
            sys.stdout.flush()
        if chunk.choices and chunk.choices[0].finish_reason:
            metrics = (chunk.model_extra or {}).get("metrics")
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
    print("\n\nmetrics:", json.dumps(metrics, indent=1))
    print("usage:", json.dumps(usage))
    return 0 if metrics and "speculative_decoding" in metrics else 1


if __name__ == "__main__":
    sys.exit(main())
