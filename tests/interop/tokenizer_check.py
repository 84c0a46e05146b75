#!/usr/bin/env python3
"""tests/interop/tokenizer_check.py: the independent side of train_gpt's GPT-2 tokenizer tests.

GPT-2's own files cannot be fetched everywhere, so byte-level BPEs are trained offline with
Hugging Face `tokenizers` (ByteLevel pre-tokenizer with GPT-2's settings) on tiny Shakespeare,
and written in GPT-2's formats: vocab.json + merges.txt, tokenizer.json, and tiktoken's rank
file (id = rank, <|endoftext|> after the last). For each corpus the ids of
  - `tokenizers` (a Tokenizer over the vocab.json + merges.txt, no added tokens: text is text)
  - `tiktoken` (an Encoding over the rank file with GPT-2's pat_str, encode_ordinary)
are hashed (sha256 of the ids as little-endian uint32); tests/cpu/test_bpe.cpp requires
train_gpt's ids, from each format, to hash the same, with no Python.

  --train         train the tokenizers into tests/interop/bpe/<name>/, and write two small
                  files for refusals (tiny.tiktoken, tiny_llmc.bin) (all committed)
  --hostile       write tests/interop/bpe/hostile.txt, the hostile corpus (committed)
  --expect        write tests/interop/bpe/expected.json: the hashes of both libraries
  --bench         tiktoken's MB/s on the texts of build/bench_bpe (make bench runs both)
  --check         recompute the hashes live and compare them with expected.json; check the
                  Unicode class table (data/unicode_classes.inc) against both libraries,
                  code point by code point; time both libraries (MB/s, one thread)
  --gpt2 DIR      GPT-2's own files, where a machine has them (vocab.json + merges.txt, or
                  OpenAI's encoder.json + vocab.bpe; their sha256 checked against those tiktoken
                  checks): train_gpt --tokenize of each corpus in them (the binary --exe names)
                  against tiktoken's and tokenizers' ids, id for id, both parts of the 90/10 split
Tiny Shakespeare is read from --data (never committed). make tokenizer-check runs --check.
Another version of `tokenizers` may train other merges: after --train, run --expect too (the
two libraries must still agree on every corpus).
Needs: pip install tokenizers tiktoken (and unicodedata2==16.0.0 for --hostile).
"""
import argparse
import base64
import hashlib
import json
import os
import random
import re
import struct
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "bpe")
PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = "<|endoftext|>"
SIZES = {"shakes1k": 1000, "shakes8k": 8000}  # merges


def nospace_megabyte():
    """A megabyte with no space: pieces of letters, digits, marks and symbols that never break at
    a space (tests/cpu/test_bpe.cpp builds the same string)."""
    words = ["a" * 4096, "Zz" * 700, "\u00e9t\u00e9", "1234567890" * 50, "!?" * 300, "\u4e2d\u6587" * 200,
             "\u0915\u093f\u0924\u093e\u092c", "\U0001F469\u200d\U0001F4BB", "don't'S're", "\u0661\u0662\u0663"]
    out, i = [], 0
    size = 0
    while size < (1 << 20):
        w = words[i % len(words)]
        out.append(w)
        size += len(w.encode())
        i += 1
    return "".join(out)


def hostile_corpus():
    import unicodedata2 as ud
    rng = random.Random(20240520)
    ws = ["\t", "\n", "\x0b", "\x0c", "\r", " ", "\x85", "\xa0", "\u1680"] + [chr(c) for c in range(0x2000, 0x200b)] + \
         ["\u2028", "\u2029", "\u202f", "\u205f", "\u3000"]
    not_ws = ["\x1c", "\x1d", "\x1e", "\x1f", "\u200b", "\u180e", "\ufeff", "\x00"]
    parts = []
    # every general category: up to 300 of its code points, evenly spread, in runs
    by_cat = {}
    for c in range(0x110000):
        if 0xD800 <= c <= 0xDFFF:
            continue
        by_cat.setdefault(ud.category(chr(c)), []).append(c)
    for cat in sorted(by_cat):
        cps = by_cat[cat]
        step = max(1, len(cps) // 300)
        picked = cps[::step][:300]
        parts.append(f"\n== {cat} ==\n")
        for k, c in enumerate(picked):
            parts.append(chr(c))
            r = rng.random()
            if r < 0.2:
                parts.append(" ")
            elif r < 0.25:
                parts.append(rng.choice(ws + not_ws))
            elif r < 0.3:
                parts.append("a")
            elif r < 0.35:
                parts.append("7")
    # every code point below U+3000, then every 61st above (surrogates left out)
    parts.append("\n== all ==\n")
    for c in list(range(0, 0x3000)) + list(range(0x3000, 0x110000, 61)):
        if not 0xD800 <= c <= 0xDFFF:
            parts.append(chr(c))
            if rng.random() < 0.1:
                parts.append(rng.choice([" ", "  ", "\n", "a", " 1", "'s"]))
    fixed = [
        "e\u0301 a\u0300\u0301\u0302\u0303 \u0915\u094d\u0937 \u05e9\u05c1\u05b8\u05dc\u05d5\u05b9\u05dd \u0627\u064e\u0644\u0652",
        "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 \U0001F1EB\U0001F1F7\U0001F1EF\U0001F1F5 "
        "\U0001F44D\U0001F3FD 1\ufe0f\u20e3 \u2764\ufe0f\u200d\U0001F525 \U0001F3F3\ufe0f\u200d\U0001F308",
        "\u4e2d\u6587\u6587\u672c\uff0c\u6d4b\u8bd5\u3002\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3002"
        "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8. \U00020000\U0002A6D6\U00030000",
        "\u0627\u0644\u0639\u0631\u0628\u064a\u0629 123 \u0639\u0631\u0628\u064a\u0629\u0664\u0665 "
        "\u05e2\u05d1\u05e8\u05d9\u05ea 2024 \u200f\u200e\u202b\u202a\u202c\u2066\u2067\u2069",
        "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'Re 'VE 'M 'LL 'D don't DON'T I'M you're YOU'RE we'Ve '' ''s ''' ' s "
        "'re' 's's x' 'x \u2019s \u2019re ' 'll'll'll 'dd 'rea 'lll 's1 '1 ' 'd\n'",
        "a\x00b \x00\x00 \x00 \x00a \x00\n\x00\t\x01\x02\x7f\x1b[31m",
        "\u00bd \u2167 \u00b2 \u0661\u0662\u0663 \u09e6\u09e7 \U0001D7CE\U0001D7CF \u2460\u2461 12\u00be 3.14 1,000,000 0x1F",
        EOT + " text " + EOT + EOT + "<|endoftext|> <|endoftext|>\n",
        " " * 300 + "x" + "\n" * 1000 + "y" + "\t \n" * 50 + " \u3000 \u00a0" * 40 + "z" + " " * 7,
    ]
    for w1 in ws + not_ws:
        for w2 in ws + not_ws:
            fixed.append("a" + w1 + w2 + "b" + w1 + w2 + "1" + w1 + w2 + "!" + w1 + " " + w2)
    parts += fixed
    rng.shuffle(fixed)
    parts += fixed
    parts.append("end \n  \n\t ")
    return "".join(parts)


def train(corpus):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers, AddedToken
    for name, merges in SIZES.items():
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=256 + merges, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      special_tokens=[], show_progress=False, min_frequency=2)
        tok.train_from_iterator([corpus], trainer=trainer)
        tok.add_special_tokens([AddedToken(EOT, special=True)])
        tok.save(os.path.join(d, "tokenizer.json"))
        # vocab.json with <|endoftext|> last, as GPT-2's; merges.txt with its #version line
        vocab = tok.get_vocab(with_added_tokens=True)
        assert vocab[EOT] == len(vocab) - 1, "the end-of-text token must come last"
        with open(os.path.join(d, "vocab.json"), "w", encoding="utf-8") as f:
            json.dump(dict(sorted(vocab.items(), key=lambda kv: kv[1])), f, ensure_ascii=False)
        tj = json.load(open(os.path.join(d, "tokenizer.json"), encoding="utf-8"))
        ms = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
        with open(os.path.join(d, "merges.txt"), "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n" + "".join(m + "\n" for m in ms))
        # tiktoken: rank = id, the end-of-text token left out (tiktoken adds it as special)
        with open(os.path.join(d, name + ".tiktoken"), "w") as f:
            for tkn, i in sorted(vocab.items(), key=lambda kv: kv[1]):
                if tkn != EOT:
                    f.write(base64.b64encode(token_bytes(tkn)).decode() + " " + str(i) + "\n")
        if name != "shakes1k":  # one tokenizer.json is enough for the tests (this one is 0.5 MB)
            os.remove(os.path.join(d, "tokenizer.json"))
        print(f"{d}: {len(ms)} merges, {len(vocab)} tokens")


def fixtures():
    """Two small files for the refusals of tests/cpu/test_bpe_cli.cpp: tiny.tiktoken (the 256
    bytes alone: 257 tokens with <|endoftext|>) and tiny_llmc.bin (llm.c's gpt2_tokenizer.bin
    format, version 2, 300 tokens, which decodes only)."""
    with open(os.path.join(OUT, "tiny.tiktoken"), "w") as f:
        for b in range(256):
            f.write(base64.b64encode(bytes([b])).decode() + f" {b}\n")
    toks = [bytes([b]) for b in range(256)] + [b"ab" * (k % 5 + 1) for k in range(43)] + [EOT.encode()]
    with open(os.path.join(OUT, "tiny_llmc.bin"), "wb") as f:
        f.write(struct.pack("<4I", 20240328, 2, len(toks), len(toks) - 1) + bytes(1024 - 16))
        for t in toks:
            f.write(bytes([len(t)]) + t)


BYTE_OF = None


def token_bytes(tkn):
    global BYTE_OF
    if BYTE_OF is None:
        bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
        cs = bs[:]
        n = 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        BYTE_OF = {chr(c): b for b, c in zip(bs, cs)}
    return bytes(BYTE_OF[ch] for ch in tkn)


def hf_bpe(vocab, merges):
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.BPE.from_file(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return tok


def hf_tokenizer(name):
    d = os.path.join(OUT, name)
    return hf_bpe(os.path.join(d, "vocab.json"), os.path.join(d, "merges.txt"))


def tt_encoding(name):
    import tiktoken
    ranks = {}
    with open(os.path.join(OUT, name, name + ".tiktoken")) as f:
        for line in f:
            if line.strip():
                b, r = line.split()
                ranks[base64.b64decode(b)] = int(r)
    return tiktoken.Encoding(name, pat_str=PAT, mergeable_ranks=ranks, special_tokens={EOT: len(ranks)})


# GPT-2's vocabulary and merges, as tiktoken's gpt2 encoding checks them (encoder.json, vocab.bpe)
GPT2_SHA256 = ("196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
               "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5")


def check_gpt2(d, data, exe):
    import shutil
    import subprocess
    import tempfile
    import tiktoken
    pair = next(((os.path.join(d, v), os.path.join(d, m)) for v, m in (("vocab.json", "merges.txt"),
                 ("encoder.json", "vocab.bpe")) if all(os.path.isfile(os.path.join(d, f)) for f in (v, m))), None)
    if pair is None:
        sys.exit(f"tokenizer_check.py: {d} holds neither vocab.json + merges.txt nor encoder.json + vocab.bpe")
    for path, want in zip(pair, GPT2_SHA256):
        got = hashlib.sha256(open(path, "rb").read()).hexdigest()
        if got != want:
            sys.exit(f"tokenizer_check.py: {path} has sha256 {got[:16]}..., not GPT-2's {want[:16]}...")
    vocab = json.load(open(pair[0], encoding="utf-8"))
    ranks = {token_bytes(t): i for t, i in vocab.items() if t != EOT}
    tt = tiktoken.Encoding("gpt2", pat_str=PAT, mergeable_ranks=ranks, special_tokens={EOT: vocab[EOT]})
    hf = hf_bpe(*pair)
    work = tempfile.mkdtemp()
    try:
        tok = os.path.join(work, "gpt2")  # Hugging Face's names, which train_gpt reads
        os.mkdir(tok)
        shutil.copy(pair[0], os.path.join(tok, "vocab.json"))
        shutil.copy(pair[1], os.path.join(tok, "merges.txt"))
        ok, total = True, 0
        for cname, text in corpora(data).items():
            src, out = os.path.join(work, cname + ".txt"), os.path.join(work, cname)
            with open(src, "w", encoding="utf-8", newline="") as f:
                f.write(text)
            r = subprocess.run([exe, "--tokenize", src, "--tokenizer", tok, "--out", out], capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"tokenizer_check.py: {exe} --tokenize failed: {r.stderr.strip()}")
            n = int(len(text) * 0.9)  # prepare.py's split, by characters
            for part, piece in (("train", text[:n]), ("val", text[n:])):
                b = open(os.path.join(out, f"{cname}_{part}.bin"), "rb").read()
                count = struct.unpack("<i", b[8:12])[0]
                ours = list(struct.unpack(f"<{count}H", b[1024:1024 + 2 * count]))
                same = ours == tt.encode_ordinary(piece) == hf.encode(piece).ids
                ok &= same
                total += count
                print(f"gpt2 {cname} {part}: {count} tokens, "
                      f"{'the same ids as tiktoken and tokenizers' if same else 'DIFFERENT ids'}")
        print(f"gpt2 check ({total} tokens): " + ("passed" if ok else "FAILED"))
        return ok
    finally:
        shutil.rmtree(work)


def ids_hash(ids):
    return hashlib.sha256(struct.pack(f"<{len(ids)}I", *ids)).hexdigest()


def corpora(data):
    with open(data, encoding="utf-8") as f:
        shakes = f.read()
    with open(os.path.join(OUT, "hostile.txt"), encoding="utf-8", newline="") as f:
        hostile = f.read()
    # one piece of 30,000 letters with merges all along it: the encoder's long-piece path
    letters = "".join(c for c in shakes if c.isascii() and c.isalpha())[:30000]
    return {"tinyshakespeare": shakes, "hostile": hostile, "nospace_mb": nospace_megabyte(), "letters_30k": letters}


def hashes(data, timing=False):
    out = {}
    for name in SIZES:
        hf, tt = hf_tokenizer(name), tt_encoding(name)
        out[name] = {}
        for cname, text in corpora(data).items():
            t0 = time.perf_counter()
            a = hf.encode(text).ids
            t1 = time.perf_counter()
            b = tt.encode_ordinary(text)
            t2 = time.perf_counter()
            out[name][cname] = {"tokenizers": ids_hash(a), "tiktoken": ids_hash(b), "count": len(b)}
            if timing:
                mb = len(text.encode()) / 1e6
                print(f"{name} {cname}: {len(a)} / {len(b)} ids, tokenizers {mb / (t1 - t0):.1f} MB/s, "
                      f"tiktoken {mb / (t2 - t1):.1f} MB/s, agree: {a == b}")
    return out


def check_classes():
    """data/unicode_classes.inc against both libraries, every code point: the pieces of probe
    strings tell a letter ("a" + c one piece), a number ("1" + c), the rest ("!" + c), a space."""
    import tiktoken
    from tokenizers import pre_tokenizers
    table = {}
    cur = None
    for line in open(os.path.join(ROOT, "data", "unicode_classes.inc")):
        m = re.match(r"constexpr CodeRange k(\w+)Ranges", line)
        if m:
            cur = m.group(1)
            continue
        for lo, hi in re.findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+)\}", line):
            for c in range(int(lo, 16), int(hi, 16) + 1):
                table[c] = cur
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    want = {c: table.get(c, "Other") for c in cps}
    p = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    n = lambda s: len(p.pre_tokenize_str(s))
    bad_hf = []
    for c in cps:
        ch = chr(c)
        got = "Letter" if n("a" + ch) == 1 else "Number" if n("1" + ch) == 1 else "Other" if n("!" + ch) == 1 else \
            "Space" if n("a" + ch + ch + "b") in (3, 4) else "?"
        if got != want[c]:
            bad_hf.append(c)
    bad_tt = []
    base = {bytes([b]): b for b in range(256)}
    for k in range(0, len(cps), 65536):
        chunk = cps[k:k + 65536]
        ranks = dict(base)
        for c in chunk:
            for pre in "a1!":
                ranks[(pre + chr(c)).encode()] = len(ranks)
            ranks[("a" + chr(c) * 2 + "b").encode()] = len(ranks)
        enc = tiktoken.Encoding("probe", pat_str=PAT, mergeable_ranks=ranks, special_tokens={})
        for c in chunk:
            ch = chr(c)
            one = lambda s: len(enc.encode_ordinary(s)) == 1
            got = "Letter" if one("a" + ch) else "Number" if one("1" + ch) else "Other" if one("!" + ch) else "Space"
            if got != want[c]:
                bad_tt.append(c)
    for lib, bad in (("tokenizers", bad_hf), ("tiktoken", bad_tt)):
        print(f"unicode classes vs {lib}: {len(bad)} of {len(cps)} code points differ"
              + (": " + " ".join(f"U+{c:04X}" for c in bad[:20]) if bad else ""))
    return not bad_hf and not bad_tt


def bench(data, mb=100.0):
    """tiktoken beside build/bench_bpe: the same texts, the same tokenizer (shakes8k's ranks)."""
    import tiktoken  # noqa: F401 (a clear ImportError when missing)
    enc = tt_encoding("shakes8k")
    shakes = open(data, encoding="utf-8").read()
    hostile = open(os.path.join(OUT, "hostile.txt"), encoding="utf-8", newline="").read()
    big = []
    size = 0
    while size < mb * 1e6:
        big += [shakes, hostile]
        size += len(shakes.encode()) + len(hostile.encode())
    big = "".join(big)

    def best(reps, f):  # the best wall time, and the CPU time of that run
        t, c = 1e30, 0
        for _ in range(reps):
            t0, c0 = time.perf_counter(), time.process_time()
            n = f()
            if time.perf_counter() - t0 < t:
                t, c = time.perf_counter() - t0, time.process_time() - c0
        return t, c, n

    print(f"tiktoken {tiktoken.__version__}: shakes8k.tiktoken ({enc.n_vocab} tokens), encode_ordinary")
    mb = len(shakes.encode()) / 1e6
    t, c, n = best(5, lambda: len(enc.encode_ordinary(shakes)))
    print(f"  tiny Shakespeare ({mb:.2f} MB, {n} ids), one thread:  {mb / t:7.1f} MB/s (of CPU time: {mb / c:.1f} MB/s)")
    t, c, n = best(1, lambda: len(enc.encode_ordinary(big)))
    print(f"  {size / 1e6:.0f} MB of text ({n} ids), one thread:              {size / 1e6 / t:7.1f} MB/s "
          f"(of CPU time: {size / 1e6 / c:.1f} MB/s)")
    lines = big.splitlines(keepends=True)
    parts = ["".join(lines[i:i + 20000]) for i in range(0, len(lines), 20000)]
    t, c, n = best(1, lambda: sum(len(x) for x in enc.encode_ordinary_batch(parts, num_threads=os.cpu_count())))
    print(f"  {size / 1e6:.0f} MB of text ({n} ids), every core (encode_ordinary_batch, {os.cpu_count()} threads): {size / 1e6 / t:7.1f} MB/s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.environ.get("TG_DATA", os.environ.get("TINYSHAKESPEARE", "")))
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--hostile", action="store_true")
    ap.add_argument("--expect", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--mb", type=float, default=100.0)
    ap.add_argument("--gpt2", default="")
    ap.add_argument("--exe", default=os.path.join(ROOT, "train_gpt"))
    a = ap.parse_args()
    if not a.data or not os.path.exists(a.data):
        sys.exit("tokenizer_check.py: tiny Shakespeare not found; pass --data PATH (or set TG_DATA)")
    if a.train:
        train(open(a.data, encoding="utf-8").read())
        fixtures()
    if a.hostile:
        with open(os.path.join(OUT, "hostile.txt"), "w", encoding="utf-8", newline="") as f:
            f.write(hostile_corpus())
    if a.expect:
        with open(os.path.join(OUT, "expected.json"), "w") as f:
            json.dump(hashes(a.data), f, indent=1, sort_keys=True)
            f.write("\n")
    if a.bench:
        bench(a.data, a.mb)
    if a.gpt2 and not check_gpt2(a.gpt2, a.data, a.exe):
        sys.exit(1)
    if a.check:
        ok = check_classes()
        live = hashes(a.data, timing=True)
        expected = json.load(open(os.path.join(OUT, "expected.json")))
        for name, cs in live.items():
            for cname, h in cs.items():
                same = expected[name][cname] == h
                ok &= same
                print(f"{name} {cname}: {'as expected.json' if same else 'DIFFERS from expected.json'}"
                      f"{'' if h['tokenizers'] == h['tiktoken'] else ' (tokenizers and tiktoken disagree)'}")
        print("tokenizer check: " + ("passed" if ok else "FAILED"))
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
