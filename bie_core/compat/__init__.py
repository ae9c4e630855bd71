"""Drop-in names for code written against other low-bit libraries
(``bie_core.compat.bitorch_engine``). See ``docs/integrations.md``."""
