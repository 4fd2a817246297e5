#!/usr/bin/env python3
"""hf_tokenizer.py: a small pure-Python reader of Hugging Face tokenizer directories.

Used by scripts/prepare_data.py when `transformers` is not installed (or with
--tokenizer-impl builtin). It covers the byte-level BPE family (GPT-2, Llama-3, Qwen2/3):

  tokenizer.json         model.type "BPE" (vocab, merges, ignore_merges), normalizer null /
                         NFC / a Sequence of those, pre_tokenizer ByteLevel or a Sequence of
                         Split (regex, behavior Isolated) + ByteLevel(use_regex false),
                         decoder ByteLevel; added_tokens matched in the raw text before BPE
                         (longest first at the leftmost position, lstrip / rstrip honoured)
  tokenizer_config.json  chat_template (a string, or named templates: "tool_use" when tools
                         are given, else "default"), bos/eos/unk/pad tokens, additional ones
  chat_template.jinja    preferred over tokenizer_config.json's chat_template, as in transformers
  special_tokens_map.json  fills special tokens tokenizer_config.json does not name

The template is rendered with jinja2 the way transformers renders it: a sandboxed
environment with trim_blocks + lstrip_blocks and the loopcontrols extension, the filters
and globals tojson, raise_exception and strftime_now, the variables messages, tools,
documents, add_generation_prompt, the special tokens (bos_token, eos_token, ...) and any
extra keyword (enable_thinking, date_string, ...). `{% generation %}` blocks render their
body. Beyond the sandbox, `str * n` / `list * n` past 1M items and integer powers past 4096
bits raise SecurityError (they allocate without bound in one step; prepare_data.py adds a
time limit per rendering). Encoding never adds a BOS/EOS (transformers' add_special_tokens=False, which is what
apply_chat_template uses: the template writes its own).

Anything outside that family is refused with TokenizerError naming the file and the JSON
path of the field, e.g. `tok/tokenizer.json: model.type = "Unigram" is not supported`.
Needs the `regex` module (\\p{L} classes in the split patterns) and `jinja2` for templates
(Debian: python3-regex, python3-jinja2; scripts/install_deps.sh installs them).
tests/check_tokenizer_parity.py compares this reader with transformers' AutoTokenizer.
"""
import json
import os
import unicodedata
from datetime import datetime

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class TokenizerError(Exception):
    """A tokenizer directory this reader cannot use; the message names file and field."""


def bytes_to_unicode():
    """The GPT-2 byte <-> printable unicode map every ByteLevel tokenizer uses."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _token_content(v):
    """A special token in tokenizer_config.json: a string or an AddedToken dict."""
    if isinstance(v, dict):
        return v.get("content")
    return v


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class HFDirTokenizer:
    def __init__(self, path):
        try:
            import regex
        except ImportError:
            raise TokenizerError("the builtin tokenizer needs the Python module `regex` "
                                 "(Debian: apt-get install python3-regex; or pip install regex)")
        self._regex = regex
        self.path = path
        tj = os.path.join(path, "tokenizer.json")
        self._tj = tj
        spec = self._load_json(tj, required=True)
        self.config = self._load_json(os.path.join(path, "tokenizer_config.json"), required=False) or {}
        self.special_map = self._load_json(os.path.join(path, "special_tokens_map.json"), required=False) or {}
        self._setup_model(spec)
        self._setup_normalizer(spec.get("normalizer"))
        self._setup_pre_tokenizer(spec.get("pre_tokenizer"))
        dec = spec.get("decoder")
        if dec is not None and dec.get("type") != "ByteLevel":
            self._refuse("decoder.type", dec.get("type"))
        self._setup_added(spec.get("added_tokens") or [])
        self.id_to_token = {i: t for t, i in self.vocab.items()}
        for t in self.added:
            self.id_to_token[t["id"]] = t["content"]
        self.vocab_size = max(self.id_to_token) + 1
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {c: b for b, c in self.byte_encoder.items()}
        self._cache = {}
        self._template_src = self._find_templates()
        self._compiled = {}

    # ---- loading -------------------------------------------------------------------------
    def _load_json(self, p, required):
        if not os.path.exists(p):
            if required:
                raise TokenizerError(f"{p}: missing (an HF tokenizer directory needs tokenizer.json)")
            return None
        try:
            with open(p, encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            raise TokenizerError(f"{p}: {e}")

    def _refuse(self, field, value):
        raise TokenizerError(f"{self._tj}: {field} = {json.dumps(value)} is not supported by the builtin "
                             "tokenizer (byte-level BPE only); install transformers for this tokenizer")

    def _setup_model(self, spec):
        m = spec.get("model")
        if not isinstance(m, dict):
            raise TokenizerError(f"{self._tj}: model: missing")
        if m.get("type") != "BPE":
            self._refuse("model.type", m.get("type"))
        for k in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
            if m.get(k):
                self._refuse(f"model.{k}", m.get(k))
        if m.get("byte_fallback"):
            self._refuse("model.byte_fallback", True)
        vocab = m.get("vocab")
        if not isinstance(vocab, dict):
            raise TokenizerError(f"{self._tj}: model.vocab: expected an object")
        self.vocab = vocab
        self.ignore_merges = bool(m.get("ignore_merges", False))
        self.ranks = {}
        for r, mg in enumerate(m.get("merges") or []):
            pair = tuple(mg.split(" ", 1)) if isinstance(mg, str) else tuple(mg)
            if len(pair) != 2 or pair[0] not in vocab or pair[1] not in vocab or pair[0] + pair[1] not in vocab:
                raise TokenizerError(f"{self._tj}: model.merges[{r}] = {json.dumps(mg)}: a part or the result "
                                     "is not in model.vocab")
            self.ranks.setdefault(pair, r)

    def _setup_normalizer(self, n):
        self.nfc = False
        items = [] if n is None else (n.get("normalizers", []) if n.get("type") == "Sequence" else [n])
        for i, it in enumerate(items):
            if it.get("type") == "NFC":
                self.nfc = True
            else:
                self._refuse(f"normalizer[{i}].type", it.get("type"))

    def _setup_pre_tokenizer(self, p):
        if p is None:
            self._refuse("pre_tokenizer", None)
        items = p.get("pretokenizers", []) if p.get("type") == "Sequence" else [p]
        self.splits = []
        saw_bytelevel = False
        for i, it in enumerate(items):
            f = f"pre_tokenizer.pretokenizers[{i}]" if p.get("type") == "Sequence" else "pre_tokenizer"
            t = it.get("type")
            if t == "Split" and not saw_bytelevel:
                if it.get("behavior") != "Isolated" or it.get("invert"):
                    self._refuse(f"{f}.behavior", [it.get("behavior"), it.get("invert")])
                pat = it.get("pattern") or {}
                if "Regex" in pat:
                    src = pat["Regex"]
                elif "String" in pat:
                    src = self._regex.escape(pat["String"])
                else:
                    self._refuse(f"{f}.pattern", pat)
                try:
                    self.splits.append(self._regex.compile(src))
                except self._regex.error as e:
                    raise TokenizerError(f"{self._tj}: {f}.pattern: {e}")
            elif t == "ByteLevel" and not saw_bytelevel:
                saw_bytelevel = True
                if it.get("add_prefix_space"):
                    self._refuse(f"{f}.add_prefix_space", True)
                if it.get("use_regex", True):
                    self.splits.append(self._regex.compile(GPT2_PATTERN))
            else:
                self._refuse(f"{f}.type", t)
        if not saw_bytelevel:
            self._refuse("pre_tokenizer (no ByteLevel step)", p.get("type"))

    def _setup_added(self, added):
        self.added = []
        for i, t in enumerate(added):
            if not isinstance(t, dict) or not isinstance(t.get("content"), str) or not isinstance(t.get("id"), int):
                raise TokenizerError(f"{self._tj}: added_tokens[{i}]: expected id and content")
            self.added.append(t)
        self.added_by_content = {t["content"]: t["id"] for t in self.added}
        self.special_ids = {t["id"] for t in self.added if t.get("special")}
        alts = []
        for t in sorted(self.added, key=lambda t: -len(t["content"])):
            alts.append((r"\s*" if t.get("lstrip") else "") + "(" + self._regex.escape(t["content"]) + ")" +
                        (r"\s*" if t.get("rstrip") else ""))
        self._added_re = self._regex.compile("|".join(f"(?:{a})" for a in alts)) if alts else None

    def _find_templates(self):
        jf = os.path.join(self.path, "chat_template.jinja")
        if os.path.exists(jf):
            with open(jf, encoding="utf-8") as f:
                return {"default": f.read()}
        ct = self.config.get("chat_template")
        if isinstance(ct, str):
            return {"default": ct}
        if isinstance(ct, list):
            return {d.get("name"): d.get("template") for d in ct if isinstance(d, dict)}
        return {}

    # ---- encode / decode -----------------------------------------------------------------
    def _bpe(self, word):
        if word in self._cache:
            return self._cache[word]
        if self.ignore_merges and word in self.vocab:
            ids = [self.vocab[word]]
        else:
            parts = list(word)
            while len(parts) > 1:
                best, best_rank = None, None
                for i in range(len(parts) - 1):
                    r = self.ranks.get((parts[i], parts[i + 1]))
                    if r is not None and (best_rank is None or r < best_rank):
                        best, best_rank = i, r
                if best is None:
                    break
                a, b = parts[best], parts[best + 1]
                out, i = [], 0
                while i < len(parts):
                    if i + 1 < len(parts) and parts[i] == a and parts[i + 1] == b:
                        out.append(a + b)
                        i += 2
                    else:
                        out.append(parts[i])
                        i += 1
                parts = out
            try:
                ids = [self.vocab[p] for p in parts]
            except KeyError as e:
                raise TokenizerError(f"{self._tj}: model.vocab has no token for {e.args[0]!r}")
        self._cache[word] = ids
        return ids

    def _encode_plain(self, text):
        if self.nfc:
            text = unicodedata.normalize("NFC", text)
        pieces = [text]
        for rx in self.splits:  # each Split (Isolated): matches and the gaps between them
            nxt = []
            for s in pieces:
                pos = 0
                for m in rx.finditer(s):
                    if m.start() > pos:
                        nxt.append(s[pos:m.start()])
                    if m.end() > m.start():
                        nxt.append(m.group())
                    pos = m.end()
                if pos < len(s):
                    nxt.append(s[pos:])
            pieces = nxt
        ids = []
        for s in pieces:
            ids += self._bpe("".join(self.byte_encoder[b] for b in s.encode("utf-8")))
        return ids

    def encode(self, text):
        """Token ids of text; added tokens in it are matched first (add_special_tokens=False)."""
        if self._added_re is None:
            return self._encode_plain(text)
        ids, pos = [], 0
        for m in self._added_re.finditer(text):
            if m.start() > pos:
                ids += self._encode_plain(text[pos:m.start()])
            content = next(g for g in m.groups() if g is not None)
            ids.append(self.added_by_content[content])
            pos = m.end()
        if pos < len(text):
            ids += self._encode_plain(text[pos:])
        return ids

    def decode(self, ids):
        out, buf = [], bytearray()
        for i in ids:
            t = self.id_to_token.get(i)
            if t is None:
                raise ValueError(f"token id {i} is not in {self._tj}")
            if t in self.added_by_content and self.added_by_content[t] == i:
                out.append(buf.decode("utf-8", errors="replace"))
                buf = bytearray()
                out.append(t)
            else:
                buf += bytes(self.byte_decoder[c] for c in t)
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    def token_strings(self):
        """The contents of every added token (special or not)."""
        return set(self.added_by_content)

    def special_token(self, name):
        """bos_token, eos_token, ...: tokenizer_config.json first, then special_tokens_map.json."""
        v = _token_content(self.config.get(name))
        if v is None:
            v = _token_content(self.special_map.get(name))
        return v

    # ---- chat template -------------------------------------------------------------------
    def _template(self, tools):
        if not self._template_src:
            raise TokenizerError(f"{self.path}: no chat_template in tokenizer_config.json and no chat_template.jinja")
        name = "tool_use" if tools and "tool_use" in self._template_src else "default"
        if name not in self._template_src:
            name = next(iter(self._template_src))
        if name not in self._compiled:
            self._compiled[name] = _jinja_env().from_string(self._template_src[name])
        return self._compiled[name]

    def check_template(self):
        """Compiles every chat template now; TokenizerError when there is none or one does not parse."""
        env = _jinja_env()  # TokenizerError without jinja2
        import jinja2
        if not self._template_src:
            self._template(None)
        for name, src in self._template_src.items():
            try:
                self._compiled[name] = env.from_string(src)
            except jinja2.exceptions.TemplateSyntaxError as e:
                where = "chat_template.jinja" if os.path.exists(os.path.join(self.path, "chat_template.jinja")) \
                    else "tokenizer_config.json: chat_template"
                raise TokenizerError(f"{self.path}/{where} ({name}): line {e.lineno}: {e.message}")

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=False, documents=None, **kwargs):
        kw = {}
        for name in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
            v = self.special_token(name)
            if v is not None:
                kw[name] = v
        extra = self.config.get("additional_special_tokens") or self.special_map.get("additional_special_tokens")
        if extra:
            kw["additional_special_tokens"] = [_token_content(x) for x in extra]
        kw.update(kwargs)
        return self._template(tools).render(messages=messages, tools=tools, documents=documents,
                                            add_generation_prompt=add_generation_prompt, **kw)


_ENV = None
# The largest repetition (`str * n`, `list * n`) and power a template may compute: a chat
# template needs neither beyond a few hundred characters (indentation, separators).
TEMPLATE_MAX_REPEAT = 1_000_000
TEMPLATE_MAX_POW_BITS = 4096


def _jinja_env():
    global _ENV
    if _ENV is None:
        try:
            import jinja2
            import jinja2.ext
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise TokenizerError("chat templates need the Python module `jinja2` "
                                 "(Debian: apt-get install python3-jinja2; or pip install jinja2)")

        class Generation(jinja2.ext.Extension):
            """{% generation %} ... {% endgeneration %}: renders its body (no assistant mask here)."""
            tags = {"generation"}

            def parse(self, parser):
                lineno = next(parser.stream).lineno
                body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
                return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

            def _body(self, caller):
                return caller()

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        class LimitedEnvironment(ImmutableSandboxedEnvironment):
            """The sandbox plus size checks on the two operators that allocate without bound
            in one step: `'a' * 10**10` (a 10 GB string) and `10 ** 10**9` (a big integer that
            takes hours). Loops that grow slowly are the caller's time limit's job."""
            intercepted_binops = frozenset(["*", "**"])

            def call_binop(self, context, operator, left, right):
                if operator == "*":
                    for seq, n in ((left, right), (right, left)):
                        if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and \
                                len(seq) * max(n, 0) > TEMPLATE_MAX_REPEAT:
                            raise jinja2.exceptions.SecurityError(
                                f"template: a repetition of {len(seq)} x {n} items (limit {TEMPLATE_MAX_REPEAT})")
                elif operator == "**":
                    if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and \
                            right * abs(left).bit_length() > TEMPLATE_MAX_POW_BITS:
                        raise jinja2.exceptions.SecurityError(
                            f"template: {left} ** {right} has more than {TEMPLATE_MAX_POW_BITS} bits")
                return super().call_binop(context, operator, left, right)

        env = LimitedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                 extensions=[Generation, jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        _ENV = env
    return _ENV


def template_errors():
    """The exception classes a template can raise while rendering (for callers to catch)."""
    import jinja2
    return (jinja2.exceptions.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError)


if __name__ == "__main__":
    import sys
    if len(sys.argv) < 3:
        print("usage: hf_tokenizer.py TOKENIZER_DIR TEXT...   (prints the ids and the decoded text)")
        sys.exit(2)
    tk = HFDirTokenizer(sys.argv[1])
    for t in sys.argv[2:]:
        ids = tk.encode(t)
        print(ids)
        print(repr(tk.decode(ids)))
