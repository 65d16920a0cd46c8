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
        # What the public methods return, and what they raise, beyond the above.
        "ClientStatus",
        "EventStream",
        "SyncEventStream",
        "GetChangeSetResponse",
        "ForkChangeSetResponse",
        "WaitSettledResponse",
        "WorkspaceBacklogResponse",
        "StoredUpdates",
        "Pause",
        "PauseResult",
        "ResumeResult",
        "SkipResult",
        "StillHeld",
        "NotPaused",
        "HeldByDaemon",
        "NotFirstInLine",
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


def test_server_surface() -> None:
    import rebaser_server

    assert set(rebaser_server.__all__) == {
        "App",
        "AppState",
        "Applied",
        "ChangeSet",
        "ChangeSetView",
        "Committed",
        "Daemon",
        "Hooks",
        "RebaserApp",
        "RefusedError",
        "RetryableError",
        "ServerConfig",
        "Settings",
        "UnprocessableError",
        "load_app",
    }
    for name in rebaser_server.__all__:
        assert hasattr(rebaser_server, name), name


def test_server_faces_resolve() -> None:
    import rebaser_server.app
    import rebaser_server.testing

    for module in (rebaser_server.app, rebaser_server.testing):
        for name in module.__all__:
            assert hasattr(module, name), name


def test_every_server_sub_package_says_what_it_owns_and_may_import() -> None:
    import importlib
    import pkgutil

    import rebaser_server

    layers = rebaser_server.__doc__ or ""
    for info in pkgutil.iter_modules(rebaser_server.__path__):
        if not info.ispkg:
            continue
        package = importlib.import_module(f"rebaser_server.{info.name}")
        doc = package.__doc__ or ""
        assert doc.strip(), f"rebaser_server.{info.name} has no docstring"
        assert "May import" in doc, f"rebaser_server.{info.name}: what may it import?"
        assert info.name in layers, f"rebaser_server.{info.name} is missing from the layers in rebaser_server"
