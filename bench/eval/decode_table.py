#!/usr/bin/env python3
"""bench/eval/decode_table.py: ours and the peer in one table, from the two JSON files
bench/eval/decode.sh writes (bench_decode --json, peer_generate.py --json).

    python3 bench/eval/decode_table.py OURS.json PEER.json [PEER.json ...] [--json OUT.json]

Per shape, one row per way of decoding at batch 1: our plain greedy loop (CUDA graphs), our
speculative loop at each acceptance rate bench_decode ran (tau given; lossless checked
against plain decoding), and each transformers generate variant that ran (dynamic cache,
static cache, static cache + torch.compile). Columns: ms per new token, tokens/s, and the
ratio to the fastest peer variant. Then our batch rows (the peer runs no batch). A
variant that failed shows its error. With several peer files, a shape's peer rows come from
the first file that has that shape (a peer run cut short by a timeout leaves later shapes
out); the JSON names the file each shape's rows came from.
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ours")
    ap.add_argument("peer", nargs="+")
    ap.add_argument("--json", help="write the merged rows here")
    a = ap.parse_args()
    try:
        ours = json.load(open(a.ours))
    except (OSError, ValueError) as e:
        sys.exit(f"decode_table: {a.ours}: {e}")
    peers, peer = {}, {}
    for path in a.peer:
        try:
            pj = json.load(open(path))
        except (OSError, ValueError) as e:
            print(f"decode_table: {path}: {e}: skipped")
            continue
        peer = peer or pj
        for s in pj.get("shapes", []):
            peers.setdefault(s["shape"], dict(s, source=path))
    merged = {"device": ours.get("device"), "prompt": ours.get("prompt"), "new": ours.get("new"),
              "peer_versions": {k: peer.get(k) for k in ("transformers", "torch")}, "shapes": []}
    print(f"decoding on {ours.get('device')}, prompt {ours.get('prompt')} tokens, {ours.get('new')} new, batch 1 "
          f"(peer: transformers {peer.get('transformers')}, torch {peer.get('torch')})")
    print("| shape | who | decoding | ms/token | tokens/s | x best peer | parts of one step |")
    print("|---|---|---|---|---|---|---|")
    for sh in ours.get("shapes", []):
        name = sh["shape"]
        p = peers.get(name, {})
        pv = [(k, v) for k, v in p.items() if isinstance(v, dict)]
        ok = [v["ms_per_token"] for _, v in pv if "ms_per_token" in v]
        best = min(ok) if ok else None
        plain_parts = (f"step {sh['plain_step_ms']:.3f} ms = {sh['plain_pct_ceiling']:.0f}% of the copy ceiling; "
                       f"verify-16 {sh['verify16_ms']:.3f} ms ({sh['verify16_over_plain']:.2f}x); draft "
                       f"{sh['draft_ms']:.3f} ms ({sh['draft_pct_ceiling']:.0f}%)")
        rows = [("ours", "plain greedy (CUDA graphs)", sh.get("plain_tpot_ms"), None, plain_parts)]
        for sp in sh.get("spec") or []:
            rows.append(("ours", f"speculative, tau {sp['tau']:.2f} (lossless {'yes' if sp['lossless'] else 'NO'})",
                         sp["tpot_ms"], None, f"draft {sp['draft_ms']:.3f} + verify {sp['verify_ms']:.3f} + "
                         f"accept {sp['accept_ms']:.3f} ms"))
        for k, v in pv:
            rows.append(("peer", f"generate, {k}", v.get("ms_per_token"), v.get("error"), ""))
        out = {"shape": name, "peer_source": p.get("source"), "rows": []}
        for who, what, ms, err, parts in rows:
            if ms is None:
                print(f"| {name} | {who} | {what} | failed: {(err or 'not run')[:80]} | | | |")
                out["rows"].append({"who": who, "decoding": what, "error": err})
                continue
            ratio = best / ms if best else None
            print(f"| {name} | {who} | {what} | {ms:.3f} | {1e3 / ms:,.0f} | "
                  f"{f'{ratio:.2f}x' if ratio else '-'} | {parts} |")
            out["rows"].append({"who": who, "decoding": what, "ms_per_token": ms, "tokens_per_s": 1e3 / ms,
                                "x_best_peer": ratio, "parts": parts})
        b = sh.get("batch")
        if b:
            out["batch"] = b
        merged["shapes"].append(out)
    bt = [(s["shape"], s["batch"]) for s in ours.get("shapes", []) if s.get("batch")]
    if bt:
        print("\nours, prompts decoded together (tokens/s of all prompts, x the plain batch; batch 1 in brackets):")
        corr = sorted({x["corrupt"] for x in bt[0][1]["spec"]}, reverse=True)
        print("| shape | batch | plain | " + " | ".join(f"spec, drafts corrupted p = {c:.2f}" for c in corr) + " |")
        print("|---|---|---|" + "---|" * len(corr))
        for name, b in bt:
            for mode in sorted({x.get("drafts", "one by one") for x in b["spec"]}, reverse=True):
                cells = []
                for c in corr:
                    x = next(y for y in b["spec"] if y["corrupt"] == c and y.get("drafts", "one by one") == mode)
                    ratio = x.get("over_plain_batch") or x["tokens_per_s"] / b["plain_tokens_per_s"]
                    cells.append(f"tau {x['tau']:.2f}: {x['tokens_per_s']:,.0f}, {ratio:.2f}x "
                                 f"({x['b1_tokens_per_s']:,.0f}){'' if x['lossless'] else ' NOT LOSSLESS'}")
                print(f"| {name} | {b['n']}, drafts {mode} | {b['plain_tokens_per_s']:,.0f} "
                      f"({b['plain_b1_tokens_per_s']:,.0f}) | " + " | ".join(cells) + " |")
            if "verify_ms" in b:
                print(f"|   one step | | plain {b['n']} rows {b['plain_step_ms']:.3f} ms | verify {16 * b['n']} rows "
                      f"{b['verify_ms']:.3f} ms ({b['verify_ms'] / b['plain_step_ms']:.2f}x) | drafts one by one "
                      f"{b['drafts_one_by_one_ms']:.3f} ms | together {b['drafts_together_ms']:.3f} ms |")
            q = b.get("queue")
            if q and q.get("prompts"):
                ok = q["plain_lossless"] == q["prompts"] and q["spec_lossless"] == q["prompts"]
                print(f"| {name} | {b['n']}, a queue of {q['prompts']} prompts, drafts together | "
                      f"{q['plain_tokens_per_s']:,.0f} | p = {q['corrupt']:.2f}, tau {q['tau']:.2f}: "
                      f"{q['spec_tokens_per_s']:,.0f}, {q['over_plain_queue']:.2f}x{'' if ok else ' NOT LOSSLESS'} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(merged, f, indent=1)
        print(f"-> {a.json}")


if __name__ == "__main__":
    main()
