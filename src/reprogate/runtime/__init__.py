"""The numeric pin (set before torch loads) and device choice."""
