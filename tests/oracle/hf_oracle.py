#!/usr/bin/env python3
"""Golden Hugging Face models for tessera's checkpoint import and export
(train/huggingface/): tiny random GPT2LMHeadModel and LlamaForCausalLM
models saved with save_pretrained, and what transformers computes with them.

  python3 tests/oracle/hf_oracle.py write OUT_DIR
      Writes OUT_DIR/<model>/ (config.json, model.safetensors or shards with
      their index) and OUT_DIR/<model>.expected.safetensors for each model:
        idx       I64 [B, T]   a batch of token ids
        logits    F32 [B, T, V] transformers' logits (float32, eval)
        logits_f64 F64 [B, T, V] the same model's in float64 (model.double(), RoPE's angles in float64 too)
        prompt    I64 [P]      a prompt
        greedy    I64 [P + N]  model.generate(prompt, greedy, N new tokens, KV cache)
  python3 tests/oracle/hf_oracle.py check-export EXPORT_DIR GOLDEN_DIR MODEL
      Loads tessera's export of golden MODEL with from_pretrained, asserts it
      reports no missing, unexpected or mismatched keys and no warning, and
      that its logits on the golden batch equal the golden ones bitwise
      (same weights, same computation). Prints one "OK ..." line.
  python3 tests/oracle/hf_oracle.py write-eos OUT_DIR
      Writes OUT_DIR/llama_eos/: a Llama with token ids, a generation config
      and a tokenizer, that says one sentence and then an eos token (below).
  python3 tests/oracle/hf_oracle.py check-tokenizer EXPORT_DIR
      Loads the export's tokenizer with AutoTokenizer.from_pretrained and
      asserts that its eos token is one of config.json's eos ids and that
      decode(encode(text)) is the text.
  python3 tests/oracle/hf_oracle.py check-generate EXPORT_DIR [PROMPT]
      check-tokenizer, then AutoModelForCausalLM.from_pretrained and greedy
      generate (at most MAX_NEW_TOKENS new tokens, the stopping ids left to
      what transformers reads from the export: generation_config.json) from
      PROMPT (default "Once upon a time"); asserts that generation stopped at
      end-of-text: the last token is one of the eos ids and fewer than
      MAX_NEW_TOKENS were produced. Prints the text and one "OK ..." line.

The models (seeded: the first seed from a fixed start whose greedy steps all
have top-2 margins over 1e-3, so float32 rounding cannot flip them; every parameter drawn from N(0, 0.25^2) plus 1 for
norm weights, so logits spread over several units):
  gpt2        GPT-2: vocab 101 (odd), 32 positions, 32 wide, 2 layers, 4 heads; one file.
  llama       Llama: GQA (4 heads, 2 kv), SwiGLU 48, rope_theta 500000, rms eps 1e-5, untied;
              saved in shards of at most 20 kB with model.safetensors.index.json.
  llama_tied  Llama: multi-query (4 heads, 1 kv), tied head (lm_head.weight not stored); one file.
  llama_eos   (write-eos) Llama 3 style, to prove an export generates to end-of-text: the
              golden Llama 3 style tokenizer (tests/oracle/golden/tokenizer/
              llama3/tokenizer.json, 665 ids) with a tokenizer_config.json and a
              chat template; bos_token_id 0 (<|begin_of_text|>), eos_token_id
              the list [1, 2] (<|end_of_text|>, <|eot|>), as Llama 3 lists its
              eos ids; a generation_config.json like Llama 3's (sampling at
              temperature 0.6, top_p 0.9, the same ids). 16 wide, 1 layer, 2
              heads, 1 kv head, untied. Its greedy continuation of any prompt is
              EOS_SENTENCE then <|eot|>, by construction, not by training: the
              sentence's 10 tokens are distinct, and token i of it gets its own
              hidden dimension ("state" i + 1; every other token state 0): its
              embedding row is that unit vector. lm_head's row of the token that
              follows state s (the sentence's first token after state 0, token
              i + 1 after state i + 1, <|eot|> after the last) is EOS_LOGIT_SCALE
              times the unit vector of s. The block's weights are random, its
              output projections (o_proj, down_proj) small (std 0.02), so the
              residual stays near the state's unit vector: after the final RMS
              norm (which scales it to about 4) the right logit is near
              4 * EOS_LOGIT_SCALE = 32 (23 to 49 measured) and every other
              below 7. A margin that wide survives tessera's export, a
              fine-tune of a few steps and float32 rounding, so greedy decoding
              must end at the second eos id of the list, after exactly 11 new
              tokens, or the export lost the ids.

The committed tests/oracle/golden/hf was made with
  python3 tests/oracle/hf_oracle.py write tests/oracle/golden/hf
  python3 tests/oracle/hf_oracle.py write-eos tests/oracle/golden/hf
(torch 2.15.0+cu132 on CPU, transformers 5.24.0, safetensors 0.8.0).
"""
import copy
import json
import logging
import os
import shutil
import sys
import warnings

import torch
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForCausalLM, AutoTokenizer, GenerationConfig, GPT2Config, GPT2LMHeadModel,
                          LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast)
from transformers.utils import logging as hf_logging

SEED = 20261127
WEIGHT_STD = 0.25
BATCH, SEQ = 2, 12
PROMPT_LEN, NEW_TOKENS = 5, 16
MIN_MARGIN = 1e-3

TOKENIZER_GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "tokenizer")
EOS_SENTENCE = " The tessellation ends here."
EOS_LOGIT_SCALE = 8.0
EOS_SEED = 20261130
MAX_NEW_TOKENS = 32


def gpt2_model():
    config = GPT2Config(vocab_size=101, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=None,
                        eos_token_id=None, pad_token_id=None)
    return GPT2LMHeadModel(config), None


def llama_model(tied):
    config = LlamaConfig(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=1 if tied else 2, max_position_embeddings=64,
                         rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                         tie_word_embeddings=tied, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(config), None if tied else "20KB"


MODELS = {"gpt2": gpt2_model, "llama": lambda: llama_model(False), "llama_tied": lambda: llama_model(True)}


def randomize(model, generator):
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * WEIGHT_STD
            is_norm = "ln_" in name or "norm" in name
            parameter.copy_(noise + 1.0 if is_norm and name.endswith("weight") else noise)


def greedy_with_margins(model, prompt):
    """The greedy continuation, or None when a step's top-2 margin is too small to compare in float32."""
    out = model.generate(prompt[None], max_new_tokens=NEW_TOKENS, do_sample=False, num_beams=1,
                         output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    for logits in out.logits:
        top = torch.topk(logits[0].double(), 2).values
        if float(top[0] - top[1]) <= MIN_MARGIN:
            return None
    return out.sequences[0]


def float64_model(model):
    """A float64 copy. transformers' Llama computes RoPE's angles and RMSNorm in float32 whatever the model's
    dtype; the copy computes both in float64 (the same formulas), so its logits are exact to float64."""
    wide = copy.deepcopy(model).double()
    if hasattr(wide, "model") and hasattr(wide.model, "rotary_emb"):
        rotary = wide.model.rotary_emb
        theta = wide.config.rope_parameters["rope_theta"]
        dim = rotary.inv_freq.numel() * 2

        def forward(x, position_ids):
            inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
            freqs = position_ids[..., None].double() * inv_freq
            angles = torch.cat((freqs, freqs), dim=-1)
            return angles.cos().to(x.dtype), angles.sin().to(x.dtype)

        rotary.forward = forward
    for module in wide.modules():  # LlamaRMSNorm normalizes in float32 whatever the dtype
        if type(module).__name__ == "LlamaRMSNorm":
            module.forward = lambda x, norm=module: norm.weight * (
                x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))
    return wide


def draw_model(make, seed):
    """A randomized model, a batch, a prompt and its greedy continuation (None: margins too small)."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model, shard_size = make()
    randomize(model, generator)
    model.eval()
    vocab = model.config.vocab_size
    idx = torch.randint(0, vocab, (BATCH, SEQ), generator=generator)
    prompt = torch.randint(0, vocab, (PROMPT_LEN,), generator=generator)
    with torch.no_grad():
        logits = model(idx).logits.float()
        greedy = greedy_with_margins(model, prompt)
        logits_f64 = float64_model(model)(idx).logits
    return model, shard_size, idx, logits, logits_f64, prompt, greedy


def write(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    for index, (name, make) in enumerate(MODELS.items()):
        for attempt in range(100):  # the first seed whose greedy steps all have clear margins
            seed = SEED + 1000 * index + attempt
            model, shard_size, idx, logits, logits_f64, prompt, greedy = draw_model(make, seed)
            if greedy is not None:
                break
        assert greedy is not None, f"{name}: no seed gave clear greedy margins"
        kwargs = {"max_shard_size": shard_size} if shard_size else {}
        model.save_pretrained(os.path.join(out_dir, name), **kwargs)
        save_file({"idx": idx, "logits": logits.contiguous(), "logits_f64": logits_f64.contiguous(), "prompt": prompt,
                   "greedy": greedy},
                  os.path.join(out_dir, f"{name}.expected.safetensors"),
                  metadata={"producer": "tests/oracle/hf_oracle.py", "seed": str(seed), "torch": torch.__version__})
        files = sorted(os.listdir(os.path.join(out_dir, name)))
        print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters, files {files}, "
              f"greedy {greedy.tolist()}")


def check_export(export_dir, golden_dir, name):
    messages = []

    class Collect(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                messages.append(record.getMessage())

    hf_logging.get_logger().addHandler(Collect())
    model_class = GPT2LMHeadModel if name == "gpt2" else LlamaForCausalLM
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, info = model_class.from_pretrained(export_dir, output_loading_info=True)
    messages += [str(w.message) for w in caught]
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(key), f"{key}: {info[key]}"
    assert not messages, f"loading printed: {messages}"
    expected = load_file(os.path.join(golden_dir, f"{name}.expected.safetensors"))
    model.eval()
    with torch.no_grad():
        logits = model(expected["idx"]).logits.float()
    difference = float((logits - expected["logits"]).abs().max())
    assert difference == 0.0, f"logits differ from the golden ones by up to {difference}"
    print(f"OK {name}: {export_dir} loads without warnings, logits bitwise equal to the golden model's")


def set_sentence_weights(model, sentence, stop):
    """Embeddings and head that make `sentence` then `stop` the greedy continuation of any prompt (the docstring)."""
    width = model.config.hidden_size
    assert len(set(sentence)) == len(sentence) and len(sentence) < width, "one hidden dimension per sentence token"
    embedding = torch.zeros(model.config.vocab_size, width)
    head = torch.zeros(model.config.vocab_size, width)
    following = sentence + [stop]  # the token after state s
    embedding[:, 0] = 1.0
    for position, token in enumerate(sentence):
        embedding[token] = torch.nn.functional.one_hot(torch.tensor(position + 1), width).float()
    for state, token in enumerate(following):
        head[token, state] = EOS_LOGIT_SCALE
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(embedding)
        model.lm_head.weight.copy_(head)


def write_eos(out_dir):
    target = os.path.join(out_dir, "llama_eos")
    os.makedirs(target, exist_ok=True)
    tokenizer_json = os.path.join(TOKENIZER_GOLDEN, "llama3", "tokenizer.json")
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=tokenizer_json, bos_token="<|begin_of_text|>",
                                        eos_token="<|end_of_text|>")
    tokenizer.chat_template = "{% for message in messages %}{{ message['content'] }}<|eot|>{% endfor %}"
    ids = tokenizer.convert_tokens_to_ids(["<|begin_of_text|>", "<|end_of_text|>", "<|eot|>"])
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, rms_norm_eps=1e-5,
                         rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, tie_word_embeddings=False,
                         bos_token_id=ids[0], eos_token_id=[ids[1], ids[2]], pad_token_id=None)
    torch.manual_seed(EOS_SEED)
    generator = torch.Generator().manual_seed(EOS_SEED)
    model = LlamaForCausalLM(config)
    randomize(model, generator)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.02 / WEIGHT_STD)
            layer.mlp.down_proj.weight.mul_(0.02 / WEIGHT_STD)
    sentence = tokenizer.encode(EOS_SENTENCE, add_special_tokens=False)
    set_sentence_weights(model, sentence, ids[2])
    model.eval()
    model.generation_config = GenerationConfig(bos_token_id=ids[0], eos_token_id=[ids[1], ids[2]], do_sample=True,
                                               temperature=0.6, top_p=0.9)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    shutil.copyfile(tokenizer_json, os.path.join(target, "tokenizer.json"))  # the golden bytes, not re-serialized
    print(f"llama_eos: {sum(p.numel() for p in model.parameters())} parameters, files {sorted(os.listdir(target))}")
    check_generate(target)


def eos_ids_of(export_dir):
    with open(os.path.join(export_dir, "config.json")) as f:
        eos = json.load(f)["eos_token_id"]
    return eos if isinstance(eos, list) else [eos]


def check_tokenizer(export_dir):
    tokenizer = AutoTokenizer.from_pretrained(export_dir)
    eos_ids = eos_ids_of(export_dir)
    assert tokenizer.eos_token_id in eos_ids, f"tokenizer eos {tokenizer.eos_token_id} not in config.json's {eos_ids}"
    text = "Once upon a time, the end."
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    print(f"OK tokenizer: {export_dir} loads as {type(tokenizer).__name__}, {len(tokenizer)} ids, eos_token "
          f"{tokenizer.eos_token!r} = {tokenizer.eos_token_id} (config.json eos_token_id {eos_ids})")
    return tokenizer


def check_generate(export_dir, prompt="Once upon a time"):
    tokenizer = check_tokenizer(export_dir)
    model = AutoModelForCausalLM.from_pretrained(export_dir)
    model.eval()
    stop_ids = model.generation_config.eos_token_id  # what generate stops at, as read from the export
    stop_ids = stop_ids if isinstance(stop_ids, list) else [stop_ids]
    inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False, num_beams=1,
                             pad_token_id=stop_ids[0])
    new = out[0, inputs["input_ids"].shape[1]:].tolist()
    print(f"generated {len(new)} tokens {new}: {tokenizer.decode(out[0])!r}")
    assert stop_ids == eos_ids_of(export_dir), f"generation_config eos {stop_ids}, config.json {eos_ids_of(export_dir)}"
    assert new and new[-1] in stop_ids, f"the last token {new[-1:]} is not an eos id {stop_ids}"
    assert len(new) < MAX_NEW_TOKENS, f"{len(new)} new tokens: generation did not stop before the limit"
    print(f"OK generate: {export_dir} stopped at eos id {new[-1]} after {len(new)} of at most {MAX_NEW_TOKENS} "
          f"new tokens (generation_config eos_token_id {stop_ids})")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        write(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "write-eos":
        write_eos(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "check-export":
        check_export(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) == 3 and sys.argv[1] == "check-tokenizer":
        check_tokenizer(sys.argv[2])
    elif len(sys.argv) in (3, 4) and sys.argv[1] == "check-generate":
        check_generate(*sys.argv[2:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
