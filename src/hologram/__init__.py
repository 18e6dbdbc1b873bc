"""hologram: a compute runtime for Python (package being assembled)."""
__version__ = "0.2.0"
