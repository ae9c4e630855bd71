"""Versions of the bie-core distribution and of the backend plugin API."""
__version__ = "0.1.0"

#: Version of the plugin interface. A backend declaring a different *major*
#: version is refused (recorded as "incompatible"); a newer *minor* version
#: loads with a warning, an older one loads silently.
API_VERSION = (1, 0)
