#!/usr/bin/env python3
"""check_tfevents.py: reads every record of a run's TensorBoard event files and checks it
against the run's JSONL metrics (common/io/tfevents.h, docs/operations.md "TensorBoard").

    check_tfevents.py RUN_DIR [--workers W1,W2] [--parser auto|protobuf|wire] [--selftest]

For every worker directory RUN_DIR/tensorboard/<worker> (--workers: these must exist):
  - each record's framing: the length, its masked CRC32C, the data, the data's masked CRC32C
    (CRC32C computed here, bit by bit from the polynomial); a torn record is allowed only
    as the last of a file (a killed writer);
  - each record parsed as an Event: with the protobuf runtime and a module that protoc
    compiles at run time from tests/tfevents.proto (the public field numbers), where the
    record must re-serialize to the same bytes without unknown fields; or (--parser wire, or
    auto without protoc / the python protobuf module) with the wire parser below, which
    refuses unknown field numbers and wrong wire types;
  - the first record of a file is file_version "brain.Event:2" only; a SessionLog START may
    only be the second record, followed by a summary at its step, and a writer of training
    steps (ev "step") has one in every file with a summary;
  - every summary: tags "<prefix>/<key>" with one prefix, steps increasing per tag within a
    file, and one JSONL line of RUN_DIR/metrics/<worker>.jsonl with ev = prefix ("step"
    for "train"), the same step, t == wall_time (to the JSONL's microseconds) and every
    value == the line's field rounded to float (null == NaN; an array field x is x_1..x_n);
    the tags are exactly the line's numeric fields (less t, inc, pid, step and the drafter's
    batch id, a metrics_u64 field); each line is used once;
  - every JSONL line with a step and a numeric field has its event, except the last line a
    process wrote (killed between its two writes).
--selftest then checks that the checker notices broken files: copies of the run with a
flipped CRC bit (data, length), a torn record that is not the last, a value off by one
float ulp, and records re-encoded (CRCs recomputed) with the tag, value, step or wall_time
under another field number must each fail. It also re-encodes every record with the
encoder below and expects the writer's bytes. Exit 0 ok, 1 a check failed, 2 usage.
"""
import argparse
import glob
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


class Bad(Exception):
    pass


# --- CRC32C and the record framing ---------------------------------------------------

def _crc_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_T = _crc_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _T[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_records(path):
    """[(offset, data)], torn: True when the file ends inside a record."""
    raw = open(path, "rb").read()
    out, off = [], 0
    while off < len(raw):
        if len(raw) - off < 12:
            return out, True
        hdr = raw[off:off + 8]
        (n,) = struct.unpack("<Q", hdr)
        (hc,) = struct.unpack("<I", raw[off + 8:off + 12])
        if hc != masked(hdr):
            raise Bad(f"{path}: offset {off}: the length's CRC is {hc:#010x}, expected {masked(hdr):#010x}")
        if len(raw) - off < 12 + n + 4:
            return out, True
        data = raw[off + 12:off + 12 + n]
        (dc,) = struct.unpack("<I", raw[off + 12 + n:off + 16 + n])
        if dc != masked(data):
            raise Bad(f"{path}: offset {off}: the data's CRC is {dc:#010x}, expected {masked(data):#010x}")
        out.append((off, data))
        off += 16 + n
    return out, False


def frame(data):
    hdr = struct.pack("<Q", len(data))
    return hdr + struct.pack("<I", masked(hdr)) + data + struct.pack("<I", masked(data))


# --- protobuf: a wire parser and encoder (fallback, and the self-test's re-encoder) -----

def varint(v):
    v &= (1 << 64) - 1
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def read_varint(b, i):
    v, shift = 0, 0
    while True:
        if i >= len(b) or shift > 63:
            raise Bad("a truncated or over-long varint")
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return v, i


def fields(b, allowed):
    """(number, value) of each field of message b; allowed: {number: wire type}."""
    i, out = 0, []
    while i < len(b):
        key, i = read_varint(b, i)
        num, wt = key >> 3, key & 7
        if num not in allowed:
            raise Bad(f"unknown field number {num} (wire type {wt})")
        if wt != allowed[num]:
            raise Bad(f"field {num}: wire type {wt}, expected {allowed[num]}")
        if wt == 0:
            v, i = read_varint(b, i)
        elif wt == 1:
            if i + 8 > len(b):
                raise Bad(f"field {num}: truncated")
            v, i = b[i:i + 8], i + 8
        elif wt == 5:
            if i + 4 > len(b):
                raise Bad(f"field {num}: truncated")
            v, i = b[i:i + 4], i + 4
        else:
            n, i = read_varint(b, i)
            if i + n > len(b):
                raise Bad(f"field {num}: length {n} past the end")
            v, i = b[i:i + n], i + n
        out.append((num, v))
    return out


def wire_parse(data):
    ev = {"wall_time": 0.0, "step": 0, "kind": None, "values": [], "file_version": None, "status": None}
    kinds = 0
    for num, v in fields(data, {1: 1, 2: 0, 3: 2, 5: 2, 6: 2}):
        if num == 1:
            (ev["wall_time"],) = struct.unpack("<d", v)
        elif num == 2:
            ev["step"] = v - (1 << 64) if v >= 1 << 63 else v
        elif num == 3:
            ev["kind"], ev["file_version"] = "file_version", v.decode("utf-8")
            kinds += 1
        elif num == 5:
            ev["kind"] = "summary"
            kinds += 1
            for vn, vb in fields(v, {1: 2}):
                tag, val = None, None
                for fn, fv in fields(vb, {1: 2, 2: 5}):
                    if fn == 1:
                        tag = fv.decode("utf-8")
                    else:
                        (val,) = struct.unpack("<f", fv)
                if tag is None or val is None:
                    raise Bad(f"a summary value without {'tag' if tag is None else 'simple_value'}")
                ev["values"].append((tag, val))
        elif num == 6:
            ev["kind"] = "session_log"
            kinds += 1
            for fn, fv in fields(v, {1: 0}):
                ev["status"] = fv
    if kinds != 1:
        raise Bad(f"{kinds} of file_version / summary / session_log in one event")
    return ev


def encode(ev, f_wall=1, f_step=2, f_tag=1, f_val=2):
    """The writer's encoding (field order, step 0 left out), field numbers changeable."""
    out = bytes([f_wall << 3 | 1]) + struct.pack("<d", ev["wall_time"])
    if ev["step"]:
        out += bytes([f_step << 3]) + varint(ev["step"])
    if ev["kind"] == "file_version":
        fv = ev["file_version"].encode()
        out += b"\x1a" + varint(len(fv)) + fv
    elif ev["kind"] == "session_log":
        out += b"\x32\x02\x08" + bytes([ev["status"]])
    else:
        s = b""
        for tag, val in ev["values"]:
            t = tag.encode()
            v = bytes([f_tag << 3 | 2]) + varint(len(t)) + t + bytes([f_val << 3 | 5]) + struct.pack("<f", val)
            s += b"\x0a" + varint(len(v)) + v
        out += b"\x2a" + varint(len(s)) + s
    return out


# --- protobuf runtime with the protoc-compiled schema ---------------------------------

def protobuf_parser(tmp):
    try:
        import google.protobuf  # noqa: F401
    except ImportError:
        return None, f"{sys.executable} has no protobuf module (Debian: python3-protobuf)"
    if not shutil.which("protoc"):
        return None, "protoc is not installed (Debian: protobuf-compiler)"
    r = subprocess.run(["protoc", f"--proto_path={HERE}", f"--python_out={tmp}", os.path.join(HERE, "tfevents.proto")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise Bad(f"protoc tests/tfevents.proto: {r.stderr.strip()}")
    sys.path.insert(0, tmp)
    import tfevents_pb2 as pb

    def parse(data):
        e = pb.Event()
        try:
            e.ParseFromString(data)
        except Exception as x:  # the runtime's DecodeError
            raise Bad(f"not an Event: {x}")
        e.DiscardUnknownFields()
        if e.SerializeToString() != data:  # unknown fields, or a field the schema types otherwise
            raise Bad(f"does not re-serialize to its bytes (unknown or mistyped fields): {e}")
        what = e.WhichOneof("what")
        ev = {"wall_time": e.wall_time, "step": e.step, "kind": what, "values": [], "file_version": None,
              "status": None}
        if what == "file_version":
            ev["file_version"] = e.file_version
        elif what == "session_log":
            ev["status"] = e.session_log.status
            if e.session_log.checkpoint_path or e.session_log.msg:
                raise Bad("a session log with a path or message")
        elif what == "summary":
            for v in e.summary.value:
                if v.WhichOneof("value") != "simple_value" or v.node_name:
                    raise Bad(f"a summary value that is not a simple_value: {v}")
                ev["values"].append((v.tag, v.simple_value))
        else:
            raise Bad(f"an event with {what}")
        return ev

    return parse, "protobuf " + google.protobuf.__version__ + " with protoc-compiled tests/tfevents.proto"


# --- the check ---------------------------------------------------------------------

def f32(x):
    if x is None:
        return float("nan")
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return math.copysign(float("inf"), x)


SKIP = {"t", "inc", "pid", "step", "batch"}


def line_scalars(line):
    """{key: expected float} of a JSONL line: its numeric fields, arrays as key_1..key_n."""
    out = {}
    for k, v in line.items():
        if k in SKIP or isinstance(v, (bool, str)):
            continue
        if v is None or isinstance(v, (int, float)):
            out[k] = f32(v)
        elif isinstance(v, list) and all(x is None or (isinstance(x, (int, float)) and not isinstance(x, bool))
                                         for x in v):
            for i, x in enumerate(v, 1):
                out[f"{k}_{i}"] = f32(x)
    return out


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def check_run(run, workers, parse, quiet=False):
    tb = os.path.join(run, "tensorboard")
    dirs = sorted(d for d in os.listdir(tb) if os.path.isdir(os.path.join(tb, d))) if os.path.isdir(tb) else []
    for w in workers:
        if w not in dirs:
            raise Bad(f"{tb}/{w}: missing")
    summary = []
    for w in dirs:
        lines = [json.loads(x) for x in open(os.path.join(run, "metrics", f"{w}.jsonl")) if x.strip()]
        stepped = [x for x in lines if isinstance(x.get("step"), int) and line_scalars(x)]
        unused = {id(x): x for x in stepped}
        by_key = {}
        for x in stepped:
            by_key.setdefault((x["ev"], x["step"]), []).append(x)
        trainer = any(x["ev"] == "step" for x in lines)
        files = sorted(glob.glob(os.path.join(tb, w, "*")))
        if not files:
            raise Bad(f"{tb}/{w}: no event file")
        n_rec = n_ev = n_val = n_torn = 0
        for path in files:
            if "tfevents" not in os.path.basename(path):
                raise Bad(f"{path}: not an event file name")
            recs, torn = read_records(path)
            n_torn += torn
            last_step = {}
            evs = []
            for off, data in recs:
                try:
                    evs.append(parse(data))
                except Bad as x:
                    raise Bad(f"{path}: record at offset {off}: {x}")
            n_rec += len(evs)
            if not evs or evs[0]["kind"] != "file_version" or evs[0]["file_version"] != "brain.Event:2" \
                    or evs[0]["step"] != 0:
                raise Bad(f"{path}: the first record is not file_version brain.Event:2: {evs[:1]}")
            has_summary = any(e["kind"] == "summary" for e in evs)
            for i, e in enumerate(evs[1:], 1):
                if e["kind"] == "file_version":
                    raise Bad(f"{path}: record {i}: a second file_version")
                if e["kind"] == "session_log":
                    if i != 1 or e["status"] != 1 or i + 1 >= len(evs) or evs[i + 1]["kind"] != "summary" \
                            or evs[i + 1]["step"] != e["step"]:
                        raise Bad(f"{path}: record {i}: a session log that is not START as the second record, "
                                  f"before a summary at its step: {e}")
                    continue
                if i == 1 and trainer:
                    raise Bad(f"{path}: a training writer's first summary without a SessionLog START before it")
                vals = e["values"]
                if not vals:
                    raise Bad(f"{path}: record {i}: an empty summary")
                prefixes = {t.split("/", 1)[0] for t, _ in vals}
                if len(prefixes) != 1 or any("/" not in t or not t.split("/", 1)[1] for t, _ in vals):
                    raise Bad(f"{path}: record {i}: tags {[t for t, _ in vals]}: not <prefix>/<key> of one prefix")
                prefix = prefixes.pop()
                ev = "step" if prefix == "train" else prefix
                got = {t.split("/", 1)[1]: v for t, v in vals}
                if len(got) != len(vals):
                    raise Bad(f"{path}: record {i}: a tag twice")
                for t, _ in vals:
                    if t in last_step and e["step"] <= last_step[t]:
                        raise Bad(f"{path}: record {i}: {t} at step {e['step']} after step {last_step[t]}")
                    last_step[t] = e["step"]
                cands = by_key.get((ev, e["step"]), [])
                match = None
                for x in cands:
                    want = line_scalars(x)
                    if abs(x["t"] - e["wall_time"]) <= 1e-6 and set(want) == set(got) and \
                            all(same(want[k], got[k]) for k in want):
                        match = x
                        break
                if match is None:
                    raise Bad(f"{path}: record {i} (step {e['step']}, wall_time {e['wall_time']:.6f}): no line of "
                              f"metrics/{w}.jsonl with these values: {got}; lines with ev {ev!r} at that step: {cands}")
                cands.remove(match)
                del unused[id(match)]
                n_ev += 1
                n_val += len(vals)
            if trainer and has_summary and not any(e["kind"] == "session_log" for e in evs):
                raise Bad(f"{path}: a training writer's file without a SessionLog START")
        # a line may lack its event only as its process's last line (killed between the writes)
        last_of_pid = {}
        for x in lines:
            last_of_pid[x["pid"]] = x
        missing = [x for x in unused.values() if last_of_pid.get(x["pid"]) is not x]
        if missing:
            raise Bad(f"metrics/{w}.jsonl: {len(missing)} line(s) with no event in {tb}/{w}, first: {missing[0]}")
        summary.append(f"{w}: {len(files)} file(s), {n_rec} records, {n_ev} events, {n_val} values"
                       + (f", {n_torn} torn tail(s)" if n_torn else "")
                       + (f", {len(unused)} last line(s) without event" if unused else ""))
    if not quiet:
        for s in summary:
            print("check_tfevents: " + s)
    return dirs


def selftest(run, parse):
    """Break copies of the run's files in ways a reader must notice; each must fail the check."""
    tb = os.path.join(run, "tensorboard")
    files = sorted(p for p in glob.glob(os.path.join(tb, "*", "*")) if len(read_records(p)[0]) >= 3)
    if not files:
        raise Bad("selftest: no event file with 3 records")
    n_enc = 0
    for p in glob.glob(os.path.join(tb, "*", "*")):  # the independent encoder gives the same bytes
        for off, data in read_records(p)[0]:
            if encode(parse(data)) != data:
                raise Bad(f"{p}: record at {off}: re-encoded here {encode(parse(data)).hex()} != {data.hex()}")
            n_enc += 1
    path = files[0]
    recs, _ = read_records(path)
    k = next(i for i, (o, d) in enumerate(recs) if parse(d)["kind"] == "summary")
    off, data = recs[k]
    ev = parse(data)
    raw = open(path, "rb").read()
    end = off + 16 + len(data)

    def flip(pos):
        b = bytearray(raw)
        b[pos] ^= 0x10
        return bytes(b)

    def reenc(**kw):
        return raw[:off] + frame(encode(ev, **kw)) + raw[end:]

    ev2 = dict(ev)
    t0, v0 = ev["values"][0]
    bumped = struct.unpack("<f", struct.pack("<I", struct.unpack("<I", struct.pack("<f", v0))[0] + 1))[0]
    ev2["values"] = [(t0, bumped)] + ev["values"][1:]
    cases = {
        "data CRC bit": flip(end - 2),
        "length CRC bit": flip(off + 9),
        "a data bit (CRC left)": flip(off + 12 + len(data) // 2),
        "torn record before a whole one": raw[:end - 3] + raw[end:],
        "a value off by one ulp": raw[:off] + frame(encode(ev2)) + raw[end:],
        "tag as field 3": reenc(f_tag=3),
        "simple_value as field 3": reenc(f_val=3),
        "simple_value as field 4": reenc(f_val=4),
        "step as field 4": reenc(f_step=4),
        "wall_time as field 2": reenc(f_wall=2),
    }
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "run")
        shutil.copytree(os.path.join(run, "metrics"), os.path.join(copy, "metrics"))
        shutil.copytree(tb, os.path.join(copy, "tensorboard"))
        target = os.path.join(copy, os.path.relpath(path, run))
        check_run(copy, [], parse, quiet=True)  # the copy itself passes
        for name, content in cases.items():
            with open(target, "wb") as f:
                f.write(content)
            try:
                check_run(copy, [], parse, quiet=True)
            except Bad as x:
                print(f"check_tfevents: selftest: {name}: refused ({str(x).replace(copy + os.sep, '')[:150]})")
                continue
            raise Bad(f"selftest: {name} in {os.path.relpath(path, run)} record {k} was not noticed")
    print(f"check_tfevents: selftest: {len(cases)} broken copies refused; {n_enc} records re-encoded "
          "here to the writer's bytes")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir")
    ap.add_argument("--workers", default="")
    ap.add_argument("--parser", choices=["auto", "protobuf", "wire"], default="auto")
    ap.add_argument("--selftest", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            parse, how = (None, "--parser wire") if a.parser == "wire" else protobuf_parser(tmp)
            if parse is None:
                if a.parser == "protobuf":
                    print(f"check_tfevents: {how}", file=sys.stderr)
                    return 1
                parse, how = wire_parse, f"the wire parser of this script ({how})"
            print(f"check_tfevents: parsing with {how}")
            check_run(a.run_dir, [w for w in a.workers.split(",") if w], parse)
            if a.selftest:
                selftest(a.run_dir, parse)
        except Bad as x:
            print(f"check_tfevents: FAIL: {x}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
