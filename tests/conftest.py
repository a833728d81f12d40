"""Test-wide settings. hypothesis profiles: the default runs hundreds of examples per property (CI);
`pytest --hypothesis-profile=long` runs thousands (local soak)."""

from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("default", max_examples=200, **_COMMON)
settings.register_profile("long", max_examples=3000, **_COMMON)
settings.load_profile("default")
