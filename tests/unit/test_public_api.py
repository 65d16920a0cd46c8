"""The public surface is deliberate: guard it."""

import rebaser_client
import rebaser_core
import rebaser_core.api
import rebaser_core.errors


def test_client_surface() -> None:
    assert set(rebaser_client.__all__) >= {
        "RebaserClient",
        "SyncRebaserClient",
        "RebaserTimeout",
        "RebaserRefused",
        "RebaserBusy",
        "RebaserUnavailable",
        "Unsupported",
        "WorkspacePk",
        "ChangeSetId",
        "RequestId",
        "SetLiteral",
    }
    for name in rebaser_client.__all__:
        assert hasattr(rebaser_client, name), name


def test_every_error_is_a_rebaser_error_and_documented_in_the_tree() -> None:
    doc = rebaser_core.errors.__doc__ or ""
    for name in rebaser_core.errors.__all__:
        cls = getattr(rebaser_core.errors, name)
        assert issubclass(cls, rebaser_core.errors.RebaserError)
        assert name in doc, f"{name} missing from the tree in the errors module docstring"


def test_core_surfaces_resolve() -> None:
    for module in (rebaser_core, rebaser_core.api):
        for name in module.__all__:
            assert hasattr(module, name), name
