"""The convert stage: a plain model folder to a SwiftKV one. `run` builds the student (surgery), initialises
its SwiftKV projections and writes the folder; `calibration` fits the lstsq init on calibration data and
measures each init against the teacher."""

from .run import ConvertSettings, convert

__all__ = ["ConvertSettings", "convert"]
