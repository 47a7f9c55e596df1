"""The SwiftKV core: config geometry (`config`), the HF models (`modeling`), the model families
(`families`) and the surgery that turns a model into a SwiftKV model and back (`surgery`).
Conversion, distillation, evaluation and serving all build on these."""

# Every family's config and model class is exported under its own name, read from the registry.

from .config import SwiftKVConfigError as SwiftKVConfigError
from .families import SWIFTKV_CLASSES
from .modeling import PairHidden as PairHidden
from .modeling import swiftkv_parameters as swiftkv_parameters

globals().update({cls.__name__: cls for cls in SWIFTKV_CLASSES})

__all__ = sorted(
    [cls.__name__ for cls in SWIFTKV_CLASSES] + ["PairHidden", "SwiftKVConfigError", "swiftkv_parameters"]
)
