"""anchorlens: measure attention anchors in prompt-tuned language models."""
