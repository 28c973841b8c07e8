#!/usr/bin/env python3
"""Golden data for tessera's byte-level BPE tokenizer (train/tokenizer),
from Hugging Face's `tokenizers` library: two small BPEs trained here on text
this script makes (accents, CJK, emoji, digits, whitespace runs, newlines,
contractions in every case), and the ids `tokenizers` gives a few hundred test
strings. tests/train/test_tokenizer.cpp must give the same ids, id for id,
without Python.

    pip install tokenizers==0.23.3 && python3 tests/oracle/tokenizer_oracle.py OUT_DIR

(tests/oracle/golden/tokenizer was written so, with tokenizers 0.23.3, whose
Oniguruma regex engine knows Unicode 16.0.0, as the C++ tables do; running it
again writes the same bytes.)

OUT_DIR/gpt2/         GPT-2 style: ByteLevel pre-tokenizer with GPT-2's regex,
  tokenizer.json      merges written as "a b" strings (the older form), the
                      special token <|endoftext|> (normalized false) and two
                      added tokens with normalized true: "endoftext" (inside the
                      special token: the two passes of added-token matching) and
                      "Hello world" (a space inside);
  vocab.json,         the same model as GPT-2's own files (no added tokens);
  merges.txt
OUT_DIR/llama3/       Llama 3 style: Split by Llama 3's regex (Isolated), then
  tokenizer.json      ByteLevel without regex, ignore_merges true, merges as
                      [a, b] pairs; special tokens <|begin_of_text|>,
                      <|end_of_text|>, <|eot|> and <|eot|>+ (leftmost-longest);
                      five words added to the vocab without merges, which
                      ignore_merges keeps whole;
OUT_DIR/gpt2_cases.json, llama3_cases.json
  one object a line: {"text": str} or {"hex": bytes} (a string that is not
  UTF-8), "ids" (tokenizer.json's, add_special_tokens=False) and for gpt2
  "pair_ids" (vocab.json + merges.txt: BPE.from_file with a ByteLevel
  pre-tokenizer) where they differ from "ids".

Ill-formed UTF-8: `tokenizers` takes str, never bytes, so for such a string
the ids are those of the pipeline tessera implements: the regex runs on the
text as Python's decoder sees it with each maximal ill-formed subpart as one
U+FFFD (Python's own error spans: a codecs error handler records them), and
`tokenizers`' BPE model encodes each piece's original bytes. The script checks
that this route gives tokenizer.encode's ids on every well-formed string.
"""
import codecs
import json
import os
import random
import sys

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"

import tokenizers  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
MERGES = 400  # merges each BPE learns (its vocab: the specials, 256 bytes, the merges)

WORDS = ("the of and to in is was that for it with as his on be at by had are but from or have an they which "
         "one you were all her she there would their we him been has when who will more no if out so said what "
         "up its about into than them can only other new some time could these two may then do first any my now "
         "such like our over man me even most made after also did many before must through back years where much "
         "your way well down should because each just those people how too little state good very make world "
         "still own see men work long get here between both life being under never day same another know while "
         "last might us great old year off come since against go came right used take three tokenizer merge "
         "encoding decoding sharded gradient").split()
ACCENTED = "café naïve résumé Zürich façade niño São Paulo Ærø Øresund Ångström crème brûlée jalapeño Dvořák".split()
GREEK_CYRILLIC = "Καλημέρα κόσμε Ελληνικά Привет мир здравствуйте Москва".split()
CJK = "東京 日本語 中文字符 测试 한국어 텍스트 ひらがな カタカナ 漢字 北京".split()
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "❤️", "🎉", "🚀", "🙂"]
CONTRACTIONS = ["don't", "it's", "we're", "they've", "I'm", "you'll", "he'd", "IT'S", "WE'RE", "I'M", "THEY'LL",
                "You'Ve", "she'D", "can't", "won't", "isn't"]
SPACES = [" ", " ", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "    "]
PUNCT = [".", ",", "!", "?", ";", ":", "...", "—", "-", "(", ")", "\"", "'", "«", "»", "¿", "¡"]


def number(rng):
    kind = rng.randrange(5)
    if kind == 0:
        return str(rng.randrange(10 ** rng.randint(1, 7)))
    if kind == 1:
        return f"{rng.uniform(0, 1000):.{rng.randint(1, 4)}f}"
    if kind == 2:
        return f"{rng.randrange(1, 10**6):,}"
    if kind == 3:
        return f"{rng.randint(1900, 2099)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    return str(rng.randrange(100))


def word(rng):
    pool = rng.random()
    if pool < 0.55:
        w = rng.choice(WORDS)
        return w.capitalize() if rng.random() < 0.15 else (w.upper() if rng.random() < 0.03 else w)
    if pool < 0.65:
        return rng.choice(ACCENTED)
    if pool < 0.70:
        return rng.choice(GREEK_CYRILLIC)
    if pool < 0.77:
        return rng.choice(CJK)
    if pool < 0.82:
        return rng.choice(EMOJI)
    if pool < 0.90:
        return rng.choice(CONTRACTIONS)
    return number(rng)


def sentence(rng):
    parts = []
    for _ in range(rng.randint(3, 14)):
        parts.append(word(rng))
        parts.append(rng.choice(SPACES) if rng.random() < 0.25 else " ")
        if rng.random() < 0.12:
            parts.append(rng.choice(PUNCT))
    parts.append(rng.choice([".", "!", "?", ".\n", "\n\n", ":\n", ""]))
    return "".join(parts)


def training_text(rng, sentences=1500):
    return "".join(sentence(rng) + rng.choice([" ", "\n", " ", "  "]) for _ in range(sentences))


def well_formed_cases(rng, specials):
    cases = [
        "", " ", "  ", "a", "hello world", "Hello  world", "hello   world  ", " leading", "trailing ", "\n",
        "\n\n\n", "a\nb", "a\r\nb", "line1\n\nline2\n", "\t\tindented", "tab\there", "mixed \t\n whitespace \n\t ",
        "x\u00a0y", "\u3000全角", " \u3000 x", "a \n b", "a  \n\n  b", "end \n", "   \n   ", "\r\r\n\n", " \r\n x",
        "don't", "DON'T", "I'm I'M i'M", "we're WE'RE We'Re", "they've THEY'VE", "you'll YOU'LL You'Ll",
        "he'd HE'D", "it's IT'S", "'s", "'S", "''s", "'ſ 'ſa ſ", "rock'n'roll", "O'Neil", "' s", "'re're're",
        "x'll'd", "'\n's", " 's", "'", "''", "'ve", "'VEe", "'Lla",
        "0", "12", "123", "1234", "12345678901234567890", "3.14159", "1,000,000", "-42", "+1 (555) 123-4567",
        "2024-05-20T12:34:56Z", "½ ⅓ ² ³ ①", "٣٤٥ ١٢", "Ⅻ ⅻ", "a1b2c3", "x 12 345 6789", "１２３",
        "café", "cafe\u0301", "naïve résumé", "Zürich", "ÆØÅ æøå", "Ελληνικά", "Привет, мир!", "שלום", "مرحبا",
        "हिन्दी", "日本語のテキスト", "中文字符测试", "한국어 텍스트", "ひらがなとカタカナ", "e\u0301\u0301",
        "😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷🇩🇪", "I ❤️ NY", "a😀b", "😀😀😀", " 😀 ", "!!!", "...", "?!?!",
        "--- *** ___", "«quote» „other“", "def f(x):\n    return x ** 2\n", "if (a && b) { c(); }",
        "<div class=\"x\">y</div>", "https://example.com/a?b=c&d=e", "user@example.com", "C:\\path\\to\\file",
        "\x00\x01\x02 control\x7f", "\ufffd", "a\ufffdb", "\uffff\U0010ffff", "\U0001d400\U0001d401",
        "a" * 300, "ab" * 200, "supercalifragilisticexpialidocious" * 5, "1" * 100, " " * 100, "\n" * 50,
        ".," * 100, "\t \n" * 30, "the" * 80, "Hello world", "Hello worlds", "xHello world", "Hello world!",
        "endoftext", "end of text", "Hello worldHello world",
    ]
    cases += specials
    cases += [f"before{s}after" for s in specials] + ["".join(specials), specials[0] + " " + specials[-1]]
    cases += [s[:-1] for s in specials] + [s[1:] for s in specials]
    letters = "abcdefghijklmnopqrstuvwxyzàéîõüßøçñ"
    cases.append("".join(rng.choice(letters) for _ in range(500)))
    pool = [chr(c) for c in list(range(0x20, 0x7f)) + list(range(0xa0, 0x250)) + list(range(0x370, 0x400)) +
            list(range(0x3040, 0x30ff)) + list(range(0x4e00, 0x4e80)) + list(range(0x1f600, 0x1f650)) +
            list(range(0x2000, 0x2070))] + SPACES + ["'s", "'LL", "'Re"]
    for length in (40, 80, 160, 400):
        cases.append("".join(rng.choice(pool) for _ in range(length)))
    for _ in range(60):
        cases.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 30))))
    for _ in range(60):
        cases.append(sentence(rng))
    return cases


def ill_formed_cases(rng):
    cases = [b"\xff", b"\x80", b"\xc3", b"\xc3(", b"abc\xe2\x82", b"\xed\xa0\x80", b"\xed\xbf\xbf x",
             b"\xf0\x9f\x98", b"\xf0\x9f\x98 x", b"\xf0\x9f\x98\x80\xf0\x9f", b"\xc0\xaf", b"\xe0\x80\xaf",
             b"\xf4\x90\x80\x80", b"\xf5\x80", b"hello \xff world", b"\xff\xfe\xfd", b" \xff", b"'\xff",
             b"'s\xff", b"x\xffy", b"\xffabc", b"12\xff34", b"\xe6\x97\xa5\xe6\x9c", b"\n\xff\n", b"\xc3\xa9\xc3",
             b"\xc2\x80\xc2", b"\xe1\x80", b"\xe1\x80x", b"\xf1\x80\x80", b"\xf1\x80\x80\xff", b"  \x80\x80  ",
             b"caf\xe9", b"na\xefve", b"'\xc5\xbf", b"'\xc5", b"\x80" * 40, b"\xfe\xff\x00a"]
    for _ in range(40):
        cases.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 40))))
    for _ in range(20):  # well-formed text with a few bytes broken
        text = bytearray(sentence(rng).encode())
        for _ in range(rng.randint(1, 3)):
            if text:
                text[rng.randrange(len(text))] = rng.randrange(128, 256)
        cases.append(bytes(text))
    return [case for case in cases if not is_utf8(case)]


def is_utf8(data):
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


_error_spans = []


def _record(error):
    _error_spans.append((error.start, error.end))
    return ("\ufffd", error.end)


codecs.register_error("tessera_oracle_record", _record)


def lossy_chars(data):
    """[(char, byte start, byte end)] as Python's decoder sees `data`: a U+FFFD per error span."""
    _error_spans.clear()
    data.decode("utf-8", errors="tessera_oracle_record")
    chars, at = [], 0
    for start, end in _error_spans + [(len(data), len(data))]:
        for ch in data[at:start].decode("utf-8"):
            size = len(ch.encode("utf-8"))
            chars.append((ch, at, at + size))
            at += size
        if start < end:
            chars.append(("\ufffd", start, end))
        at = end
    return chars


def _gpt2_byte_chars():
    """GPT-2's bytes_to_unicode (the route's input to the BPE model; checked against encode below)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    others = [b for b in range(256) if b not in printable]
    return {b: chr(b) if b in printable else chr(256 + others.index(b)) for b in range(256)}


BYTE_CHAR = _gpt2_byte_chars()
assert sorted(BYTE_CHAR.values()) == sorted(pre_tokenizers.ByteLevel.alphabet())


def to_alphabet(data):
    return "".join(BYTE_CHAR[b] for b in data)


def ids_by_route(tokenizer, data):
    """The pre-tokenizer on the lossy-decoded text, the BPE model on each piece's original bytes."""
    chars = lossy_chars(data)
    text = "".join(ch for ch, _, _ in chars)
    ids = []
    for _, (begin, end) in tokenizer.pre_tokenizer.pre_tokenize_str(text):
        piece = data[chars[begin][1]:chars[end - 1][2]]
        ids += [token.id for token in tokenizer.model.tokenize(to_alphabet(piece))]
    return ids


def train(text, pre_tokenizer, specials, ignore_merges):
    tokenizer = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=len(specials) + 256 + MERGES, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[AddedToken(s, special=True, normalized=False) for s in specials])
    tokenizer.train_from_iterator([text], trainer=trainer)
    return tokenizer


def case_record(case, ids, extra=None):
    record = {"hex": case.hex()} if isinstance(case, bytes) else {"text": case}
    record["ids"] = ids
    record.update(extra or {})
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def write_cases(path, header, records):
    with open(path, "w", encoding="utf-8") as out:
        out.write(json.dumps(header, separators=(",", ":")) + "\n")
        for record in records:
            out.write(record + "\n")


def encode_all(tokenizer, cases, added_contents):
    results = []
    for case in cases:
        if isinstance(case, bytes):
            assert not any(content.encode() in case for content in added_contents), case
            results.append(ids_by_route(tokenizer, case))
            continue
        ids = tokenizer.encode(case, add_special_tokens=False).ids
        if not any(content in case for content in added_contents):
            assert ids_by_route(tokenizer, case.encode()) == ids, case
        results.append(ids)
    return results


def with_whole_words(tokenizer_json, words):
    """The tokenizer with `words` added to its vocab and no merges for them: with
    ignore_merges each is one token, as in Llama 3's vocab (tiktoken's, where
    many tokens have no merge path); without it the merges would cut them."""
    saved = json.loads(tokenizer_json)
    vocab = saved["model"]["vocab"]
    next_id = max(vocab.values()) + 1
    for word in words:
        vocab[to_alphabet(word.encode())] = next_id
        next_id += 1
    return json.dumps(saved, ensure_ascii=False, separators=(",", ":"))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    rng = random.Random(20240520)
    text = training_text(rng)
    header = {"producer": "tests/oracle/tokenizer_oracle.py", "tokenizers": tokenizers.__version__,
              "training_text_chars": len(text)}

    # ---- GPT-2 style ----
    gpt2_specials = ["<|endoftext|>"]
    gpt2 = train(text, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), gpt2_specials, False)
    gpt2.add_tokens([AddedToken("endoftext", normalized=True), AddedToken("Hello world", normalized=True)])
    os.makedirs(os.path.join(out, "gpt2"), exist_ok=True)
    saved = json.loads(gpt2.to_str())
    saved["model"]["merges"] = [f"{a} {b}" for a, b in saved["model"]["merges"]]  # the older "a b" form
    gpt2_json = json.dumps(saved, ensure_ascii=False, indent=None, separators=(",", ":"))
    with open(os.path.join(out, "gpt2", "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(gpt2_json + "\n")
    gpt2 = Tokenizer.from_str(gpt2_json)  # the file as written is the one the ids come from
    gpt2.model.save(os.path.join(out, "gpt2"))
    pair = Tokenizer(models.BPE.from_file(os.path.join(out, "gpt2", "vocab.json"),
                                          os.path.join(out, "gpt2", "merges.txt")))
    pair.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    pair.decoder = decoders.ByteLevel()

    gpt2_added = gpt2_specials + ["endoftext", "Hello world"]
    cases = well_formed_cases(random.Random(1), gpt2_specials) + ill_formed_cases(random.Random(2))
    ids = encode_all(gpt2, cases, gpt2_added)
    pair_ids = encode_all(pair, cases, [])
    records = [case_record(case, a, None if a == b else {"pair_ids": b}) for case, a, b in zip(cases, ids, pair_ids)]
    write_cases(os.path.join(out, "gpt2_cases.json"),
                dict(header, tokenizer="gpt2/tokenizer.json", pair=["gpt2/vocab.json", "gpt2/merges.txt"]), records)
    print(f"gpt2: {gpt2.get_vocab_size()} ids, {len(cases)} cases, "
          f"{sum(a != b for a, b in zip(ids, pair_ids))} where the vocab.json + merges.txt ids differ")

    # ---- Llama 3 style ----
    llama_specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot|>", "<|eot|>+"]
    llama_pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    llama = train(text, llama_pre, llama_specials, True)
    assert '"ignore_merges":true' in llama.to_str()
    whole_words = ["Tesseract", " mosaic", " tessellation", "naïveté", "ſtraße"]
    llama_json = with_whole_words(llama.to_str(), whole_words)
    llama = Tokenizer.from_str(llama_json)
    for word in whole_words:
        assert len(llama.encode(word, add_special_tokens=False).ids) == 1, word
    os.makedirs(os.path.join(out, "llama3"), exist_ok=True)
    with open(os.path.join(out, "llama3", "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(llama_json + "\n")
    cases = (well_formed_cases(random.Random(1), llama_specials) + whole_words + ["".join(whole_words)] +
             ["Tesseracts", "the mosaic tiles", "a tessellation.", "naïveté!"] + ill_formed_cases(random.Random(2)))
    ids = encode_all(llama, cases, llama_specials)
    write_cases(os.path.join(out, "llama3_cases.json"), dict(header, tokenizer="llama3/tokenizer.json"),
                [case_record(case, i) for case, i in zip(cases, ids)])
    print(f"llama3: {llama.get_vocab_size()} ids, {len(cases)} cases")


if __name__ == "__main__":
    main()
