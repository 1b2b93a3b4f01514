"""The language model's tokenizer, training setup, plan and scoring."""
