#!/usr/bin/env python3
"""demo_corpus.py: structured text with regularities a drafter can learn, generated offline.

    python3 scripts/demo_corpus.py --sample log          # one document of a kind
    python3 scripts/demo_corpus.py --stats --n 200       # sizes per kind
    python3 scripts/train_target.py --shape tiny --corpus demo:0.75 ...   # how it is used

Why: the embedded default's target (4 layers, width 128) trained on the Python standard
library alone writes loose code-shaped text, whose greedy continuations a 1-layer drafter
predicts only about a third of the time, however long it trains (docs/drafter_quality.md).
Real text is often far more regular than that: logs, tables, CSV and JSON records, SQL
dumps, config files, listings, generated code. A target that has learned such text
continues it along its regularities (the next timestamp, the closing tag, the same keys in
the same order, the column padding), and those continuations are what a drafter can
predict several tokens ahead from the target's features.

Every document is drawn from a random.Random seeded by (split, seed, index), stdlib only,
so the corpus is the same on every machine and held-out documents ("heldout" split) are
never the training ones ("train" split): different draws of the same generators. Values
(names, numbers, words) are random; the formats around them are what repeats.

Kinds (KINDS): log (three log styles), csv, jsonl, table (psql-style aligned), sql (INSERT
dumps), xml, ini, metrics (a sensor time series), listing (ls -l), arith (arithmetic and
a timetable), pyclass (record classes with the usual methods), pyconst (constants,
their message table and their tests).

mix(spec, train, held, seed) is what scripts/train_target.py --corpus calls: "stdlib"
leaves the standard-library corpus alone; "demo:F" adds structured documents so that F of
all documents (hence F of the training windows and of the answered prompts, which are
drawn per document) are structured; "demo:1" drops the standard library.
"""
import argparse
import datetime
import random
import sys

FIRST = ("alice bob carol dave erin frank grace heidi ivan judy mallory nina oscar peggy "
         "quentin rupert sybil trent ursula victor walter xena yusuf zoe amir bianca chen "
         "dmitri elena farid greta hugo ines jonas kaito lena marco noor olga pablo rosa "
         "sanjay tomas uma vera wei yara").split()
LAST = ("smith jones garcia miller davis lopez wilson moore taylor anderson thomas martin "
        "lee walker hall allen young king wright scott green baker adams nelson hill "
        "campbell mitchell roberts carter phillips evans turner torres parker collins "
        "edwards stewart morris murphy cook rogers morgan cooper peterson reed bailey").split()
CITIES = ("Oslo Lisbon Berlin Madrid Paris Vienna Prague Dublin Warsaw Athens Rome Zurich "
          "Helsinki Riga Tallinn Sofia Porto Lyon Munich Hamburg Krakow Ghent Turin Seville "
          "Bergen Malmo Aarhus Leeds Bristol Glasgow").split()
NOUNS = ("account address amount archive batch bucket cache channel client cluster column "
         "comment config cursor customer device document domain event feature file filter "
         "folder group handler host image index invoice item job key label layer ledger "
         "limit link message metric model module node note order owner packet page "
         "parcel payment policy port price product profile project queue quota record "
         "region report request resource route rule sample schema score session shard "
         "signal source stage status stock store stream task tenant ticket token topic "
         "trace user value vendor version volume warning widget worker zone").split()
ADJS = ("active archived blue cold dark empty fast final green hidden large local main "
        "new old open partial primary private public quick raw red remote shared short "
        "silent small stale static strict temp valid").split()
VERBS = ("add build check clear close commit copy create delete fetch find flush get "
         "load lock merge move open parse push read refresh remove render reset resolve "
         "save scan send set sort split start stop sync update upload validate write").split()
MONTHS = "Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split()


def _name(rng):
    return rng.choice(FIRST), rng.choice(LAST)


def _start_time(rng):
    return datetime.datetime(rng.randint(2019, 2025), rng.randint(1, 12), rng.randint(1, 28),
                             rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59))


def _ident(rng, parts=2):
    return "_".join(rng.choice(NOUNS if i == parts - 1 else ADJS + NOUNS) for i in range(parts))


def _fill(rng, size, head, line):
    """head() once, then line(i) for i = 0, 1, ... until the document reaches size bytes."""
    out = [head()] if head else []
    n, i = sum(map(len, out)), 0
    while n < size:
        s = line(i)
        out.append(s)
        n += len(s)
        i += 1
    return "".join(out)


# ---- the kinds ---------------------------------------------------------------------------

def gen_log(rng, size):
    style = rng.randrange(3)
    t = _start_time(rng)
    host = f"{rng.choice(NOUNS)}-{rng.randint(1, 9)}"
    if style == 0:  # application log: timestamp, level, component, message
        comps = rng.sample(["api", "auth", "db", "cache", "worker", "scheduler", "billing", "search"], 3)
        paths = [f"/api/v{rng.randint(1, 3)}/{n}s" for n in rng.sample(NOUNS, 4)]

        def line(i):
            nonlocal t
            t += datetime.timedelta(milliseconds=rng.choice([3, 17, 250, 480, 1000, 1200, 2300]))
            lvl = rng.choices(["INFO", "WARN", "ERROR", "DEBUG"], [80, 8, 3, 9])[0]
            c = rng.choice(comps)
            msg = rng.choice([
                lambda: f"GET {rng.choice(paths)}/{rng.randint(1, 9999)} 200 {rng.randint(2, 90)}ms",
                lambda: f"POST {rng.choice(paths)} 201 {rng.randint(5, 300)}ms",
                lambda: f"{rng.choice(VERBS)} {rng.choice(NOUNS)} id={rng.randint(1, 99999)} ok",
                lambda: f"cache hit ratio {rng.randint(50, 99)}.{rng.randint(0, 9)}%",
                lambda: f"retrying {rng.choice(NOUNS)} in {rng.choice([1, 2, 5, 10])}s (attempt {rng.randint(1, 4)}/5)",
            ])()
            return f"{t:%Y-%m-%d %H:%M:%S}.{t.microsecond // 1000:03d} {lvl:<5} [{c}-{rng.randint(1, 4)}] {msg}\n"
    elif style == 1:  # syslog: sshd and cron lines on one host
        def line(i):
            nonlocal t
            t += datetime.timedelta(seconds=rng.choice([0, 1, 1, 2, 7, 30, 61]))
            u = rng.choice(FIRST)
            ip = f"10.{rng.randint(0, 3)}.{rng.randint(0, 9)}.{rng.randint(2, 254)}"
            pid = rng.randint(1000, 32000)
            msg = rng.choice([
                f"sshd[{pid}]: Accepted publickey for {u} from {ip} port {rng.randint(40000, 65000)} ssh2",
                f"sshd[{pid}]: pam_unix(sshd:session): session opened for user {u}(uid={rng.randint(1000, 1100)}) by (uid=0)",
                f"sshd[{pid}]: Disconnected from user {u} {ip} port {rng.randint(40000, 65000)}",
                f"CRON[{pid}]: ({u}) CMD (/usr/local/bin/{rng.choice(VERBS)}-{rng.choice(NOUNS)}.sh)",
                f"systemd[1]: Started {rng.choice(NOUNS)}-{rng.choice(VERBS)}.service.",
            ])
            return f"{MONTHS[t.month - 1]} {t.day:2d} {t:%H:%M:%S} {host} {msg}\n"
    else:  # web server access log
        pages = [f"/{rng.choice(NOUNS)}/{rng.choice(NOUNS)}.html" for _ in range(5)] + ["/", "/index.html"]
        agents = ["Mozilla/5.0 (X11; Linux x86_64)", "curl/8.5.0", "python-requests/2.31.0"]

        def line(i):
            nonlocal t
            t += datetime.timedelta(seconds=rng.choice([0, 0, 1, 2, 3, 9]))
            ip = f"192.168.{rng.randint(0, 3)}.{rng.randint(2, 254)}"
            code = rng.choices([200, 304, 404, 500], [85, 8, 6, 1])[0]
            return (f'{ip} - - [{t:%d}/{MONTHS[t.month - 1]}/{t:%Y:%H:%M:%S} +0000] "GET {rng.choice(pages)} '
                    f'HTTP/1.1" {code} {rng.randint(200, 20000)} "-" "{rng.choice(agents)}"\n')
    return _fill(rng, size, None, line)


def _record_fields(rng):
    """A schema: a sequential id first, then 3-5 fields drawn from a pool."""
    pool = ["name", "email", "city", "qty", "price", "status", "sku", "score", "created"]
    return ["id"] + rng.sample(pool, rng.randint(3, 5))


def _record(rng, fields, i, id0, t0):
    first, last = _name(rng)
    v = {}
    for f in fields:
        if f == "id":
            v[f] = id0 + i
        elif f == "name":
            v[f] = f"{first.capitalize()} {last.capitalize()}"
        elif f == "email":
            v[f] = f"{first}.{last}@example.com"
        elif f == "city":
            v[f] = rng.choice(CITIES)
        elif f == "qty":
            v[f] = rng.randint(1, 20)
        elif f == "price":
            v[f] = round(rng.randint(99, 9999) / 100, 2)
        elif f == "status":
            v[f] = rng.choices(["active", "pending", "closed"], [6, 3, 1])[0]
        elif f == "sku":
            v[f] = f"{rng.choice(NOUNS)[:3].upper()}-{rng.randint(0, 9999):04d}"
        elif f == "score":
            v[f] = rng.randint(0, 100)
        elif f == "created":
            v[f] = (t0 + datetime.timedelta(hours=i * rng.choice([1, 2]))).strftime("%Y-%m-%d %H:00")
    return v


def gen_csv(rng, size):
    fields, id0, t0 = _record_fields(rng), rng.randint(1, 5000), _start_time(rng)
    q = lambda x: f"{x:.2f}" if isinstance(x, float) else str(x)
    return _fill(rng, size, lambda: ",".join(fields) + "\n",
                 lambda i: ",".join(q(x) for x in _record(rng, fields, i, id0, t0).values()) + "\n")


def gen_jsonl(rng, size):
    fields, id0, t0 = _record_fields(rng), rng.randint(1, 5000), _start_time(rng)

    def js(x):
        return f"{x:.2f}" if isinstance(x, float) else (str(x) if isinstance(x, int) else f'"{x}"')
    return _fill(rng, size, None, lambda i: "{" + ", ".join(
        f'"{k}": {js(x)}' for k, x in _record(rng, fields, i, id0, t0).items()) + "}\n")


def gen_table(rng, size):
    """psql-style aligned tables, several per document, each with its own schema."""
    out, n = [], 0
    while n < size:
        fields, id0, t0 = _record_fields(rng), rng.randint(1, 500), _start_time(rng)
        rows = [_record(rng, fields, i, id0, t0) for i in range(rng.randint(8, 30))]
        cell = lambda x: f"{x:.2f}" if isinstance(x, float) else str(x)
        w = {f: max(len(f), *(len(cell(r[f])) for r in rows)) for f in fields}
        num = {f: isinstance(rows[0][f], (int, float)) for f in fields}
        s = [f"{_ident(rng)}=> SELECT {', '.join(fields)} FROM {rng.choice(NOUNS)}s ORDER BY id;\n"]
        s.append("|".join(f" {f:^{w[f]}} " for f in fields) + "\n")
        s.append("+".join("-" * (w[f] + 2) for f in fields) + "\n")
        for r in rows:
            s.append("|".join(f" {cell(r[f]):>{w[f]}} " if num[f] else f" {cell(r[f]):<{w[f]}} "
                              for f in fields).rstrip() + "\n")
        s.append(f"({len(rows)} rows)\n\n")
        out.append("".join(s))
        n += len(out[-1])
    return "".join(out)


def gen_sql(rng, size):
    table = rng.choice(NOUNS) + "s"
    fields, id0, t0 = _record_fields(rng), rng.randint(1, 5000), _start_time(rng)

    def lit(x):
        return f"{x:.2f}" if isinstance(x, float) else (str(x) if isinstance(x, int) else f"'{x}'")
    head = lambda: (f"-- dump of table {table}\nCREATE TABLE {table} (\n" +
                    ",\n".join(f"    {f} {'INTEGER PRIMARY KEY' if f == 'id' else 'TEXT'}" for f in fields) +
                    "\n);\n")
    return _fill(rng, size, head, lambda i: f"INSERT INTO {table} ({', '.join(fields)}) VALUES (" +
                 ", ".join(lit(x) for x in _record(rng, fields, i, id0, t0).values()) + ");\n")


def gen_xml(rng, size):
    item = rng.choice(NOUNS)
    fields, id0, t0 = _record_fields(rng), rng.randint(1, 5000), _start_time(rng)

    def rec(i):
        r = _record(rng, fields, i, id0, t0)
        body = "".join(f"    <{k}>{x}</{k}>\n" for k, x in r.items() if k != "id")
        return f'  <{item} id="{r["id"]}">\n{body}  </{item}>\n'
    return _fill(rng, size, lambda: f'<?xml version="1.0" encoding="UTF-8"?>\n<{item}s>\n', rec) + f"</{item}s>\n"


def gen_ini(rng, size):
    def section(i):
        name = rng.choice(NOUNS)
        keys = [("enabled", lambda: rng.choice(["true", "false"])),
                ("host", lambda: f"{name}{rng.randint(1, 9)}.internal"),
                ("port", lambda: str(rng.choice([80, 443, 5432, 6379, 8080, 9000 + rng.randint(0, 99)]))),
                ("timeout", lambda: f"{rng.choice([5, 10, 30, 60])}s"),
                ("retries", lambda: str(rng.randint(0, 5))),
                ("path", lambda: f"/var/lib/{name}/{rng.choice(NOUNS)}"),
                ("owner", lambda: rng.choice(FIRST)),
                ("log_level", lambda: rng.choice(["info", "debug", "warning"]))]
        ks = rng.sample(keys, rng.randint(3, 6))
        return f"[{name}.{rng.choice(ADJS)}]\n" + "".join(f"{k} = {v()}\n" for k, v in ks) + "\n"
    return _fill(rng, size, lambda: f"; {rng.choice(NOUNS)} service configuration\n\n", section)


def gen_metrics(rng, size):
    hosts = [f"{rng.choice(NOUNS)}-{i}" for i in range(1, rng.randint(2, 4))]
    cols = rng.sample(["cpu", "mem", "disk", "net_in", "net_out", "load"], 3)
    step = rng.choice([10, 15, 30, 60])
    t = _start_time(rng).replace(second=0)
    val = {(h, c): rng.uniform(5, 60) for h in hosts for c in cols}

    def line(i):
        nonlocal t
        h = hosts[i % len(hosts)]
        if i % len(hosts) == 0 and i:
            t += datetime.timedelta(seconds=step)
        vs = []
        for c in cols:
            val[h, c] = min(99.9, max(0.1, val[h, c] + rng.uniform(-2, 2)))
            vs.append(f"{val[h, c]:.1f}")
        return f"{t:%Y-%m-%dT%H:%M:%SZ},{h}," + ",".join(vs) + "\n"
    return _fill(rng, size, lambda: "time,host," + ",".join(cols) + "\n", line)


def gen_listing(rng, size):
    out, n = [], 0
    while n < size:
        d = f"/home/{rng.choice(FIRST)}/{rng.choice(NOUNS)}"
        exts = rng.sample([".py", ".txt", ".json", ".csv", ".log", ".md", ".yaml", ".c", ".h"], 3)
        names = sorted({f"{_ident(rng, rng.randint(1, 2))}{rng.choice(exts)}" for _ in range(rng.randint(8, 25))})
        owner, t = rng.choice(FIRST), _start_time(rng)
        s = [f"$ ls -l {d}\n", f"total {rng.randint(8, 400)}\n"]
        for nm in names:
            tt = t - datetime.timedelta(hours=rng.randint(0, 2000))
            perm = rng.choice(["-rw-r--r--", "-rw-r--r--", "-rwxr-xr-x", "-rw-------"])
            s.append(f"{perm} 1 {owner:<8} staff {rng.randint(0, 99999):>7} {MONTHS[tt.month - 1]} {tt.day:2d} "
                     f"{tt:%H:%M} {nm}\n")
        s.append("\n")
        out.append("".join(s))
        n += len(out[-1])
    return "".join(out)


def gen_arith(rng, size):
    """Tables computed from a random start (a wide range, so that held-out tables are not
    the training ones): multiplication, number bases, a timetable."""
    def block(i):
        k = rng.randrange(3)
        if k == 0:
            a = rng.randint(12, 9999)
            return f"# multiplication table of {a}\n" + "".join(f"{a} x {b:2d} = {a * b}\n" for b in range(1, 13)) + "\n"
        if k == 1:
            lo = rng.randint(0, 65535 - 12)
            return ("# decimal, hex, octal, binary\n" +
                    "".join(f"{v:5d}  0x{v:04x}  0o{v:06o}  0b{v:016b}\n" for v in range(lo, lo + 12)) + "\n")
        t, step = rng.randint(300, 1200), rng.choice([5, 10, 12, 15, 20, 25, 30, 40, 45])
        line, city = rng.randint(1, 99), rng.choice(CITIES)
        rows = []
        for _ in range(rng.randint(6, 14)):
            rows.append(f"  {t // 60 % 24:02d}:{t % 60:02d}  line {line:<3} to {city:<9} every {step} min\n")
            t += step
        return f"# departures, {rng.choice(NOUNS)} station\n" + "".join(rows) + "\n"
    return _fill(rng, size, None, block)


def gen_pyclass(rng, size):
    def cls(i):
        name = "".join(w.capitalize() for w in (rng.choice(ADJS), rng.choice(NOUNS))) + rng.choice(["Record", "Info", "Entry", ""])
        fields = list(dict.fromkeys(_ident(rng, 2) for _ in range(rng.randint(3, 6))))
        s = [f"class {name}:\n", f'    """A {" ".join(fields[0].split("_"))} with its {len(fields) - 1} attributes."""\n\n',
             f"    def __init__(self, {', '.join(fields)}):\n"]
        s += [f"        self._{f} = {f}\n" for f in fields]
        for f in fields:
            s += ["\n    @property\n", f"    def {f}(self):\n", f"        return self._{f}\n"]
        s += ["\n    def to_dict(self):\n", "        return {\n"]
        s += [f'            "{f}": self._{f},\n' for f in fields]
        s += ["        }\n", "\n    def __repr__(self):\n",
              f'        return f"{name}(' + ", ".join(f"{f}={{self._{f}!r}}" for f in fields) + ')"\n\n\n']
        return "".join(s)
    return _fill(rng, size, lambda: f'"""{rng.choice(NOUNS)} records."""\n\n\n', cls)


def gen_pyconst(rng, size):
    def block(i):
        prefix = rng.choice(NOUNS).upper()
        base = rng.choice([100, 200, 1000, 4000])
        names = list(dict.fromkeys(f"{prefix}_{rng.choice(ADJS + NOUNS).upper()}" for _ in range(rng.randint(4, 9))))
        s = [f"{n} = {base + j}\n" for j, n in enumerate(names)]
        s += [f"\n{prefix}_MESSAGES = {{\n"]
        s += [f'    {n}: "{n.split("_", 1)[1].lower()} {prefix.lower()}",\n' for n in names]
        s += ["}\n\n\n", f"class Test{prefix.capitalize()}Codes(unittest.TestCase):\n"]
        for j, n in enumerate(names):
            s += [f"    def test_{n.lower()}(self):\n",
                  f"        self.assertEqual({n}, {base + j})\n",
                  f'        self.assertEqual({prefix}_MESSAGES[{n}], "{n.split("_", 1)[1].lower()} {prefix.lower()}")\n\n']
        return "".join(s) + "\n"
    return _fill(rng, size, lambda: "import unittest\n\n", block)


KINDS = {"log": gen_log, "csv": gen_csv, "jsonl": gen_jsonl, "table": gen_table, "sql": gen_sql,
         "xml": gen_xml, "ini": gen_ini, "metrics": gen_metrics, "listing": gen_listing,
         "arith": gen_arith, "pyclass": gen_pyclass, "pyconst": gen_pyconst}


def document(split, seed, i):
    """Document i of a split: (kind, bytes). The kinds take turns; the size is 3-8 KB."""
    rng = random.Random(f"demo-corpus/{split}/{seed}/{i}")  # str seeds hash with SHA-512: stable
    kind = sorted(KINDS)[i % len(KINDS)]
    return kind, KINDS[kind](rng, rng.randint(3000, 8000)).encode("ascii")


def documents(split, seed, n):
    return [document(split, seed, i)[1] for i in range(n)]


def parse_spec(spec):
    """'stdlib' -> 0.0; 'demo:F' -> F (0 < F <= 1). Raises ValueError naming the spec."""
    if spec == "stdlib":
        return 0.0
    if spec.startswith("demo:"):
        try:
            f = float(spec[5:])
        except ValueError:
            f = -1.0
        if 0.0 < f <= 1.0:
            return f
    raise ValueError(f"--corpus {spec!r}: expected 'stdlib' or 'demo:F' with 0 < F <= 1 "
                     "(F: the structured share of the documents)")


def mix(spec, train, held, seed):
    """The corpus of spec (parse_spec) from the standard library's train/held documents:
    structured documents are added so that they make up F of each list (F = 1: they
    replace the standard library; then 1200 training and 60 held-out documents)."""
    f = parse_spec(spec)
    if f == 0.0:
        return train, held
    if f == 1.0:
        nt, nh = 1200, 60
    else:
        nt = max(1, round(len(train) * f / (1 - f)))
        nh = max(1, round(len(held) * f / (1 - f)))
    st, sh = documents("train", seed, nt), documents("heldout", seed, nh)
    print(f"demo_corpus: {spec}: {nt} structured training documents ({sum(map(len, st)) / 1e6:.1f} MB), "
          f"{nh} held-out ({sum(map(len, sh)) / 1e6:.1f} MB), {len(KINDS)} kinds", flush=True)
    if f == 1.0:
        return st, sh
    return train + st, held + sh


def kind_of(text, docs):
    """The kind of the first document of docs (a list of (kind, bytes), e.g.
    [document("heldout", seed, i) for i in range(n)]) that contains text (bytes), or None:
    how the benchmark tells a structured held-out prompt from a standard-library one."""
    for kind, doc in docs:
        if text in doc:
            return kind
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sample", choices=sorted(KINDS), help="print one document of this kind")
    ap.add_argument("--stats", action="store_true", help="sizes per kind over --n documents")
    ap.add_argument("--split", default="train", choices=["train", "heldout"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n", type=int, default=120)
    a = ap.parse_args()
    if a.sample:
        rng = random.Random(f"demo-corpus/sample/{a.seed}")
        sys.stdout.write(KINDS[a.sample](rng, 3000))
    elif a.stats:
        sizes = {}
        for i in range(a.n):
            kind, doc = document(a.split, a.seed, i)
            sizes.setdefault(kind, []).append(len(doc))
        for k in sorted(sizes):
            print(f"{k:8} {len(sizes[k]):4} documents, {sum(sizes[k]) / len(sizes[k]):6.0f} bytes on average")
    else:
        ap.print_help()
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
