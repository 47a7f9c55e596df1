"""Knowledge-preserving distillation of SwiftKV students on CPU (data, loss, trainer, CLI command)."""
