"""``recon serve/collect``: an OpenAI-compatible server over the local model, and a client for one."""

from __future__ import annotations

import argparse
import os

from recon.errors import ReconError


def cmd_serve(args: argparse.Namespace) -> int:
    import socket

    from recon.recovery.model import LocalModel
    from recon.server.serve import Limits, is_loopback, make_server

    for name in ("max_concurrency", "max_tokens_limit", "timeout", "queue_timeout", "keep_alive", "max_connections"):
        if getattr(args, name) <= 0:
            raise ReconError(f"--{name.replace('_', '-')} must be positive")
    if args.max_queue < 0:
        raise ReconError("--max-queue must be 0 or more")
    api_key = args.api_key or os.environ.get("RECON_API_KEY") or None
    if not is_loopback(args.host) and not api_key:
        raise ReconError(f"--host {args.host} is not a loopback address; anyone who can reach it could use the model: "
                         "give --api-key KEY (or set RECON_API_KEY)")
    limits = Limits(max_concurrency=args.max_concurrency, max_queue=args.max_queue, queue_timeout=args.queue_timeout,
                    max_tokens=args.max_tokens_limit, timeout=args.timeout, keep_alive=args.keep_alive,
                    max_connections=args.max_connections)
    try:
        with socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((args.host, args.port))  # a taken port fails now, not after loading the model
        server = make_server(LocalModel(args.model, threads=args.threads), args.host, args.port, limits, api_key=api_key)
    except OSError as e:  # port taken, address not ours
        raise ReconError(f"cannot listen on {args.host}:{args.port} ({e.strerror or e})") from None
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"serving {args.model} on http://{host}:{server.server_port}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


def cmd_collect(args: argparse.Namespace) -> int:
    from recon.recovery.model import load_prompts
    from recon.samples.records import write_records
    from recon.server.client import collect

    prompts = load_prompts(args.prompts)
    records = collect(args.url, prompts, dataset=args.dataset, model=args.model, n=args.n, temperature=args.temperature,
                      top_p=args.top_p, max_tokens=args.max_tokens, seed=args.seed, token_ids=not args.no_token_ids,
                      api_key=os.environ.get(args.api_key_env) if args.api_key_env else None)
    n = write_records(records, args.out)
    print(f"wrote {n} records to {args.out}")
    return 0


def add_serve(sub) -> None:
    p = sub.add_parser("serve", help="an OpenAI-compatible server over the local model")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--threads", type=int)
    p.add_argument("--max-concurrency", type=int, default=4, help="requests served at once (default 4)")
    p.add_argument("--max-queue", type=int, default=32, help="requests waiting beyond those; more get 429 (default 32)")
    p.add_argument("--max-tokens-limit", type=int, default=2048,
                   help="most tokens one request may generate, max_tokens x n (default 2048; bounds memory too)")
    p.add_argument("--queue-timeout", type=float, default=60.0,
                   help="seconds a request may wait for the model; then 503 (default 60)")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds a request may take to arrive, head and body, and a send may stall (default 30)")
    p.add_argument("--keep-alive", type=float, default=5.0, help="seconds an idle connection stays open (default 5)")
    p.add_argument("--max-connections", type=int, default=256, help="open connections; beyond, 503 (default 256)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1 (default: $RECON_API_KEY; "
                   "needed to bind anything but loopback)")
    p.set_defaults(func=cmd_serve)


def add_collect(sub) -> None:
    p = sub.add_parser("collect", help="query an OpenAI-compatible server for each prompt, keep records")
    p.add_argument("prompts")
    p.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--out", required=True)
    p.add_argument("--dataset", default="collected")
    p.add_argument("--model")
    p.add_argument("--n", type=int, default=1)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-token-ids", action="store_true", help="don't ask for return_token_ids (plain OpenAI APIs)")
    p.add_argument("--api-key-env", help="environment variable holding the API key")
    p.set_defaults(func=cmd_collect)
