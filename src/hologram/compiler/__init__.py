"""The compiler: canonicalize -> schedule -> render -> compile."""
