#!/usr/bin/env python3
"""Hugging Face `tokenizers` timed as bench/tokenizer times tessera's tokenizer:
one thread, encode with a fresh tokenizer (its word cache empty), encode again
(warm, best of --repeat), encode the text cut into pieces of about 4 KB (at
the first newline 4096 bytes or more into each: `encode_batch`, the
library's fastest way here), decode the whole (`decode`) and the pieces
(`decode_batch`), in MB of text per second of the process's CPU time (the
wall time beside it), best of --repeat.

    pip install tokenizers
    python3 bench/tokenizer_speed.py prepare DIR
        DIR/fortunes.txt: the cookie files of Debian's fortunes package
          (/usr/share/games/fortunes, as the default corpus lists them, not
          rendered), 2.6 MB of English;
        DIR/multilingual.txt: 4 MB of the mixed text of
          tests/oracle/tokenizer_oracle.py (accents, Greek, Cyrillic, CJK,
          emoji, digits, contractions, whitespace runs);
        DIR/gpt2/tokenizer.json, DIR/llama3/tokenizer.json: BPEs of 32,000
          ids trained on both texts with GPT-2's and Llama 3's pre-tokenizers.
    python3 bench/tokenizer_speed.py time --tokenizer DIR/gpt2/tokenizer.json --text DIR/fortunes.txt
    build/bench/tokenizer --tokenizer DIR/gpt2/tokenizer.json --text DIR/fortunes.txt

TOKENIZERS_PARALLELISM=false and RAYON_NUM_THREADS=1 are set before the
library loads: one thread, as tessera's.
"""
import argparse
import os
import random
import sys
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"

from tokenizers import Tokenizer  # noqa: E402

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "oracle"))
import tokenizer_oracle  # noqa: E402  (defines: training_text, train, LLAMA3_REGEX)

FORTUNES = "/usr/share/games/fortunes"
VOCAB = 32000


def fortunes_text():
    names = sorted(n for n in os.listdir(FORTUNES)
                   if not n.endswith(".dat") and not os.path.islink(os.path.join(FORTUNES, n))
                   and os.path.isfile(os.path.join(FORTUNES, n)))
    return b"".join(open(os.path.join(FORTUNES, n), "rb").read() for n in names).decode("utf-8")


def prepare(out):
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, trainers
    os.makedirs(out, exist_ok=True)
    texts = {"fortunes.txt": fortunes_text(),
             "multilingual.txt": tokenizer_oracle.training_text(random.Random(7), sentences=80000)}
    for name, text in texts.items():
        with open(os.path.join(out, name), "w", encoding="utf-8", newline="") as f:
            f.write(text)
        print(f"{out}/{name}: {len(text.encode())} bytes")
    styles = {
        "gpt2": pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        "llama3": pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(tokenizer_oracle.LLAMA3_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
    }
    for style, pre_tokenizer in styles.items():
        tokenizer = Tokenizer(models.BPE(ignore_merges=style == "llama3"))
        tokenizer.pre_tokenizer = pre_tokenizer
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=VOCAB, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      special_tokens=[AddedToken("<|endoftext|>", special=True, normalized=False)])
        tokenizer.train_from_iterator(list(texts.values()), trainer=trainer)
        os.makedirs(os.path.join(out, style), exist_ok=True)
        tokenizer.save(os.path.join(out, style, "tokenizer.json"))
        print(f"{out}/{style}/tokenizer.json: {tokenizer.get_vocab_size()} ids")


def timed(work):
    cpu, wall = time.process_time(), time.perf_counter()
    result = work()
    return result, time.process_time() - cpu, time.perf_counter() - wall


def print_rate(what, size, cpu, wall):
    mb = size / 1e6
    print(f"{what:<22} {mb / cpu:8.2f} MB/s  ({cpu:.3f} s CPU; wall {wall:.3f} s, {mb / wall:.2f} MB/s)")


def pieces_of(data, size=4096):
    """The text cut at the first newline `size` bytes or more into each piece (as bench/tokenizer cuts it)."""
    pieces, start = [], 0
    while start < len(data):
        end = data.find(b"\n", start + size)
        end = len(data) if end < 0 else end + 1
        pieces.append(data[start:end].decode("utf-8"))
        start = end
    return pieces


def best(repeat, work):
    return min(timed(work)[1:] for _ in range(repeat))


def time_tokenizer(tokenizer_path, text_path, repeat):
    import tokenizers
    with open(text_path, "rb") as f:
        data = f.read()
    text = data.decode("utf-8")
    tokenizer = Tokenizer.from_file(tokenizer_path)
    print(f"tokenizers {tokenizers.__version__}, one thread; tokenizer {tokenizer_path} "
          f"({tokenizer.get_vocab_size()} ids)")
    encoding, cpu, wall = timed(lambda: tokenizer.encode(text, add_special_tokens=False))
    ids = encoding.ids
    print(f"text: {text_path}, {len(data)} bytes -> {len(ids)} tokens ({len(data) / len(ids):.2f} bytes a token)")
    print_rate("encode (cache empty)", len(data), cpu, wall)
    print_rate("encode (cache warm)", len(data), *best(repeat, lambda: tokenizer.encode(text, add_special_tokens=False)))
    pieces = pieces_of(data)
    print_rate(f"encode {len(pieces)} pieces", len(data),
               *best(repeat, lambda: tokenizer.encode_batch(pieces, add_special_tokens=False)))
    print_rate("decode", len(data), *best(repeat, lambda: tokenizer.decode(ids, skip_special_tokens=False)))
    piece_ids = [encoding.ids for encoding in tokenizer.encode_batch(pieces, add_special_tokens=False)]
    print_rate(f"decode {len(pieces)} pieces", len(data),
               *best(repeat, lambda: tokenizer.decode_batch(piece_ids, skip_special_tokens=False)))
    decoded = tokenizer.decode(ids, skip_special_tokens=False)
    print("round trip:", "decode(encode(text)) == text" if decoded == text else "DIFFERS")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("prepare").add_argument("dir")
    timing = commands.add_parser("time")
    timing.add_argument("--tokenizer", required=True)
    timing.add_argument("--text", required=True)
    timing.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.dir)
    else:
        time_tokenizer(args.tokenizer, args.text, args.repeat)


if __name__ == "__main__":
    main()
