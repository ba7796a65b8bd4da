"""Parametrizes the :class:`area_cases.AreaCases` tests from each test class's ``cases``."""


def pytest_generate_tests(metafunc):
    cases = getattr(metafunc.cls, "cases", None)
    if not cases:
        return
    if "positive" in metafunc.fixturenames:
        metafunc.parametrize(
            ("rule_id", "positive"), [(r, s) for r, (pos, _) in cases.items() for s in pos]
        )
    if "lookalike" in metafunc.fixturenames:
        metafunc.parametrize(
            ("rule_id", "lookalike"), [(r, s) for r, (_, neg) in cases.items() for s in neg]
        )
