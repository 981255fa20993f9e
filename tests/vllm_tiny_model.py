"""Build a tiny random-weight Llama model + BPE tokenizer that vLLM (CPU) will serve.

Run with the vLLM venv's python (it has torch/transformers/tokenizers):
``python tests/vllm_tiny_model.py DEST``.  No model hub is reachable, so everything is made
locally; a fixed seed keeps the output deterministic so cached builds stay valid.
The shapes are the smallest vLLM's CPU backend serves (head_dim 32 is the smallest its attention
accepts).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

VOCAB_SIZE = 640
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 (2 = EOS)
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_WORDS = (
    "the a an of to and in is it that for on with as was by be at this from or have not are "
    "but they which one you were all we when there can had more if some out what so about "
    "time will up other into than then only could new very these two may first like any "
    "model server token request latency stream load test queue cache memory prompt answer "
    "question user assistant system fast slow small large quick brown fox jumps over lazy dog "
    "river mountain city people world house water light night morning evening book story"
).split()


def corpus_lines(n: int = 400, seed: int = 0) -> list[str]:
    """Deterministic English-like sentences so BPE learns word-ish merges."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(5, 16))]
        sentence = " ".join(words).capitalize() + rng.choice([".", "?", "!", ","])
        if rng.random() < 0.2:
            sentence += f" {rng.randint(0, 9999)}"
        lines.append(sentence)
    return lines


def build_tokenizer(dest: Path) -> None:
    """Byte-level BPE with the full byte alphabet, so any text (incl. UTF-8) encodes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    for i, name in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(name) == i, (name, tok.token_to_id(name))
    assert tok.get_vocab_size() <= VOCAB_SIZE, tok.get_vocab_size()

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        unk_token=None,
        pad_token="<|endoftext|>",
        model_max_length=1 << 20,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(dest))

    # Make the config explicit regardless of the transformers version's defaults.
    cfg_path = dest / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(
        tokenizer_class="PreTrainedTokenizerFast",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def build_model(dest: Path) -> None:
    """Random float32 LlamaForCausalLM (~377k params); seed 0 for reproducible weights."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(str(dest), safe_serialization=True)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0).save_pretrained(str(dest))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: vllm_tiny_model.py DEST", file=sys.stderr)
        return 2
    dest = Path(argv[1])
    dest.mkdir(parents=True, exist_ok=True)
    build_tokenizer(dest)
    build_model(dest)
    print(f"tiny model written to {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
