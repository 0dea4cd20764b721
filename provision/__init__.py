"""mgpu-cloud controller: spec -> plan -> create -> inventory -> bootstrap -> launch -> destroy."""

__version__ = "0.1.0"
