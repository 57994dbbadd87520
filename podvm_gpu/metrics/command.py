"""The ``metrics`` command (:func:`run_metrics`, the one entry under the CLI) and what it does:
print once, serve over HTTP, write the textfile.

Importing this module costs nothing beyond the standard library: prometheus-client and the
exporter are imported by the functions that need them, so the boot can import
:func:`write_boot_textfile` and the settings without paying for them when the textfile is off.
"""

from __future__ import annotations

import os
import sys
import threading

from podvm_gpu.config.metrics import MetricsSettings, parse_listen
from podvm_gpu.host.fs import Root, atomic_write, ensure_dir


def in_words(err: Exception) -> str:
    """An error as its words: ``strerror`` of an ``OSError`` (``Address already in use``), without
    the ``[Errno N]`` and the file names Python adds (``atomic_write``'s temporary file is not
    what the reader asked for: the caller names its target); ``str()`` of anything else."""
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return str(err)


def print_once(root: Root, settings: MetricsSettings, openmetrics: bool = False,
               out=None) -> int:
    """Print the metrics once: Prometheus text format 0.0.4, or OpenMetrics 1.0.0.

    Args:
        root: the :class:`Root` to read under.
        settings: the :class:`MetricsSettings`.
        openmetrics: True for OpenMetrics.
        out: a binary stream, stdout's by default.

    Returns:
        0 when printed (the GPUs' and the boot's state are in the metrics), 1 when the output
        could not be written.
    """
    text = _rendered(root, settings, openmetrics=openmetrics)
    stream = out if out is not None else sys.stdout.buffer
    try:
        stream.write(text)
        stream.flush()
    except OSError as err:
        print(f"podvm-gpu metrics: cannot write the metrics: {in_words(err)}", file=sys.stderr)
        return 1
    return 0


def write_textfile(root: Root, settings: MetricsSettings, exporter=None) -> str:
    """Write every metric to ``settings.textfile_path`` under the root, atomically (mode 0644),
    in the Prometheus text format node-exporter's textfile collector reads.

    Args:
        exporter: an ``Exporter`` to reuse (``serve``); a new one otherwise.

    Returns:
        The real path written.

    Raises:
        OSError: the directory cannot be made or written.
    """
    return _write(root, settings, _rendered(root, settings, exporter))


def _rendered(root: Root, settings: MetricsSettings, exporter=None, openmetrics: bool = False) -> bytes:
    """One scrape, rendered (``exporter.render``): by ``exporter`` (serve's, left open), else by
    a new ``Exporter``, closed after."""
    from podvm_gpu.metrics.exporter import Exporter, render

    scraper = exporter or Exporter(root, settings)
    try:
        return render(scraper.families(), openmetrics)
    finally:
        if exporter is None:
            scraper.close()


def write_boot_textfile(root: Root, settings: MetricsSettings) -> str | None:
    """For the boot's end: write the boot's, the daemons' and the kernel log's metrics (no NVML)
    to the textfile when ``settings.textfile`` is on; nothing (None) when it is off.

    Costs the import of prometheus-client (about 0.1 s) only when on, so a boot with the
    textfile off, the default, pays nothing for it.

    Returns:
        The real path written, or None.

    Raises:
        OSError: the directory cannot be made or written.
    """
    if not settings.textfile:
        return None
    from podvm_gpu.metrics.exporter import Exporter, render

    return _write(root, settings, render(Exporter(root, settings).families(with_nvml=False)))


def _write(root: Root, settings: MetricsSettings, text: bytes) -> str:
    """Write the textfile where its path leads, links in its folders followed under the root;
    refused (PermissionError) when they lead under a folder no textfile goes in: the config's
    text was checked when loaded, but a link such as ``/var/lib/node_exporter ->
    /etc/podvm-gpu`` wrote into the agent's config folder (issue 35 item 17)."""
    import errno

    from podvm_gpu.config.metrics import forbidden_folder

    path = root.resolve(settings.textfile_path, follow_last=False)
    inside = path if root.is_host else "/" + os.path.relpath(path, root.path)
    forbidden = forbidden_folder(inside)
    if forbidden:
        raise PermissionError(errno.EPERM, f"refused: a link in its path leads to {inside}, "
                                           f"under {forbidden[0]} ({forbidden[1]})")
    ensure_dir(os.path.dirname(path))
    atomic_write(path, text)
    return path


def make_server(root: Root, settings: MetricsSettings, listen: str, exporter=None, web=None,
                journal=None):
    """An HTTP server for ``listen`` (``HOST:PORT``; port 0: any free one) that answers
    ``GET /metrics`` with one scrape, negotiated by the ``Accept`` header as prometheus-client
    does (OpenMetrics when asked, else text 0.0.4) and gzipped when accepted.

    Args:
        web: a loaded :class:`webconfig.WebConfig` (TLS, basic auth), or None for plain HTTP.
        journal: the :class:`journal.Journal` of the server's lines (a new one by default).

    Returns:
        The :class:`server.MetricsServer`, bound, not yet serving (``serve_forever``).

    Raises:
        ValueError: ``listen`` is not ``HOST:PORT``.
        OSError: the address cannot be bound (in use, not an address of this VM).
    """
    import gzip

    from podvm_gpu.metrics.exporter import Exporter, Families, type_dcgm_counters
    from podvm_gpu.metrics.prom import choose_encoder, gzip_accepted
    from podvm_gpu.metrics.server import MetricsServer, Response

    host, port = parse_listen(listen, allow_any_port=True)
    exporter = exporter or Exporter(root, settings, keep_open=True)

    def answer(request) -> Response:
        if request.path.split("?", 1)[0] not in ("/metrics", "/"):
            return Response(404, b"only /metrics is here\n")
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        body = encoder(Families(exporter.families()))
        if content_type.startswith("text/plain"):
            body = type_dcgm_counters(body)
        headers = [("Content-Type", content_type)]
        if gzip_accepted(request.headers.get("accept-encoding", "")):
            body = gzip.compress(body)
            headers.append(("Content-Encoding", "gzip"))
        return Response(200, body, headers)

    server = MetricsServer(host, port, answer, web, journal=journal)
    server.exporter = exporter
    return server


def load_web(root: Root, settings: MetricsSettings, web_config: str | None):
    """The web config to serve with: ``web_config`` (a path on this machine, from
    ``--web-config``), else ``settings.web_config`` (a path in the VM, under the root), else
    None (plain HTTP).

    Raises:
        webconfig.WebConfigError: the file is bad or names a key not implemented.
    """
    path = web_config or (root.resolve(settings.web_config) if settings.web_config else "")
    if not path:
        return None
    from podvm_gpu.metrics.webconfig import load_web_config

    return load_web_config(path)


def serve(root: Root, settings: MetricsSettings, listen: str | None = None,
          stop: threading.Event | None = None, web_config: str | None = None) -> int:
    """Serve the metrics over HTTP at ``listen`` (default ``settings.listen``; ``""``: no HTTP
    server) and, when ``settings.textfile`` is on, rewrite the textfile every
    ``settings.textfile_interval_s`` seconds; until ``stop`` is set (or the process is stopped).

    Once serving, nothing it says is fatal: the ``serving`` line and every later one are best
    effort (a stderr on a full disk loses them), and a textfile that cannot be written is said at
    most once a minute, as the server's own trouble is (``journal.Journal``).

    Args:
        web_config: a web config file on this machine (``--web-config``), or None for the
            settings' ``web_config``.

    Returns:
        1 when there is nothing to do, the address cannot be bound or the web config is bad
        (the message says why), 0 when ``stop`` ended it.

    Raises:
        KeyboardInterrupt: Ctrl-C (:func:`run` turns it into one line and 130).
    """
    from podvm_gpu.metrics.exporter import Exporter
    from podvm_gpu.metrics.journal import Journal
    from podvm_gpu.metrics.webconfig import WebConfigError

    off = 'metrics.listen is ""' if listen is None else '--listen ""'
    listen = settings.listen if listen is None else listen
    if not listen and not settings.textfile:
        # say what is off and where it was turned off: '--listen ""' reads as "serve at the
        # default" to a new user (issue 35 item 12)
        print(f"podvm-gpu metrics: nothing to serve: the HTTP server is off ({off}) and the "
              "textfile is off (metrics.textfile is false; --textfile turns it on)",
              file=sys.stderr)
        return 1
    try:
        web = load_web(root, settings, web_config) if listen else None
    except WebConfigError as err:
        print(f"podvm-gpu metrics: bad web config: {err}", file=sys.stderr)
        return 1
    stop = stop or threading.Event()
    exporter = Exporter(root, settings, keep_open=True)
    journal = Journal()
    server = None
    if listen:
        try:
            server = make_server(root, settings, listen, exporter, web, journal)
        except (OSError, ValueError) as err:
            print(f"podvm-gpu metrics: cannot listen on {listen}: {in_words(err)}", file=sys.stderr)
            return 1
        _say_serving(server, web)
        threading.Thread(target=server.serve_forever, name="podvm-gpu-http", daemon=True).start()
    _until_stopped(root, settings, stop, exporter, journal, server)
    return 0


def _say_serving(server, web) -> None:
    """The ``serving`` line (scheme, the bound address, basic auth) of ``server``, and a warning
    when the web config ``web`` (None: none) leaves it as open as none would."""
    from podvm_gpu.metrics.journal import say

    host, port = server.server_address[:2]
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    scheme = "https" if web is not None and web.ssl_context is not None else "http"
    auth = ", basic auth" if web is not None and web.users else ""
    say(f"serving {scheme}://{where}/metrics{auth}")
    if web is not None and web.plain:
        # a web config was named, and it leaves the server as open as none would (issue 35
        # item 16): said, as exporter-toolkit serves such a file without a word
        say(f"warning: the web config {web.path} sets no TLS and no basic auth ({web.plain}): "
            "serving plain HTTP without authentication")


def _until_stopped(root: Root, settings: MetricsSettings, stop: threading.Event, exporter,
                   journal, server) -> None:
    """Rewrite the textfile every ``settings.textfile_interval_s`` seconds when it is on (else
    only wait) until ``stop`` is set or the wait raises (Ctrl-C); then the HTTP server (None:
    none) is shut down and the exporter closed."""
    try:
        while not stop.is_set():
            if settings.textfile:
                _rewrite_textfile(root, settings, exporter, journal)
            stop.wait(settings.textfile_interval_s if settings.textfile else None)
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        exporter.close()


def _rewrite_textfile(root: Root, settings: MetricsSettings, exporter, journal) -> None:
    """One rewrite of the textfile while serving: a failure is said through ``journal`` (at
    most once a minute per kind), never raised, so the server goes on."""
    try:
        write_textfile(root, settings, exporter)
    except OSError as err:
        journal.say("textfile", f"cannot write {settings.textfile_path}: "
                                f"{in_words(err)} (said at most once a minute)")
    except Exception as err:  # as a scrape's 500: one line, and the server goes on
        journal.say("textfile-error", f"error writing {settings.textfile_path}: "
                                      f"{type(err).__name__}: {err}")


_serve = serve  # run_metrics takes the --serve flag under that name


def write_pod_labels(root: Root) -> int:
    """``metrics --pod-labels`` (issue 28): the short-lived reader of apf.json."""
    from podvm_gpu.metrics.pod import LABELS_PATH, write_labels

    try:
        _labels, warning = write_labels(root)
    except OSError as err:
        print(f"podvm-gpu metrics: cannot write {LABELS_PATH}: {err.strerror or err}",
              file=sys.stderr)
        return 1
    if warning:
        print(f"podvm-gpu metrics: warning: {warning}", file=sys.stderr)
    else:
        print(f"podvm-gpu metrics: pod labels written to {LABELS_PATH}", file=sys.stderr)
    return 0


def run_metrics(root_dir: str, config: str | None, listen: str | None = None,
                serve: bool = False, openmetrics: bool = False, textfile: bool = False,
                web_config: str | None = None, pod_labels: bool = False) -> int:
    """``podvm-gpu metrics [--listen ADDR:PORT | --serve] [--web-config FILE] [--openmetrics]
    [--textfile]``, for the CLI to call after it parsed the line: the ``metrics:`` settings of
    the config (the defaults without one), then print once, serve or write the textfile.
    ``--pod-labels``: only the pod labels file (podvm_gpu/metrics/pod.py), exit 0 (with one
    warning when apf.json gives none) or 1 when the labels file cannot be written.

    Args:
        root_dir: the root (``--root``); config: ``--config`` or None (the root's own file).
        listen: ``--listen``; serve: ``--serve``; openmetrics, textfile: those flags;
        web_config: ``--web-config``.

    The config is trusted as boot trusts it: a file another user than root could write is
    refused (the exporter runs as root, writes the textfile it names and reads the web config it
    names), the same verdict as boot's, ``config``'s and ``check``'s.

    Returns:
        The exit code: 0 done, 1 could not serve, print or write, 2 a bad config, 130
        interrupted by Ctrl-C (one line on stderr, no traceback).
    """
    from podvm_gpu.errors import ConfigError

    root = Root(root_dir)
    if pod_labels:
        return write_pod_labels(root)
    try:
        settings = _settings(root, config)
    except (ConfigError, OSError) as err:
        print(f"podvm-gpu: error: {err}", file=sys.stderr)
        return 2
    serving = serve or listen is not None
    try:
        if serving:
            settings.textfile = settings.textfile or textfile
            return _serve(root, settings, listen, web_config=web_config)
        if textfile:
            try:
                written = write_textfile(root, settings)
            except OSError as err:
                print(f"podvm-gpu metrics: cannot write {settings.textfile_path}: {in_words(err)}",
                      file=sys.stderr)
                return 1
            print(f"podvm-gpu metrics: wrote {root.host_path(written)}", file=sys.stderr)
            return 0
        return print_once(root, settings, openmetrics)
    except KeyboardInterrupt:
        from podvm_gpu.metrics.journal import say

        say("interrupted")
        return 130


def _settings(root: Root, config: str | None) -> MetricsSettings:
    """The config's ``metrics:`` settings with its ``health.reset_pending_warns`` (the defaults
    when there is no config file), the config trusted as boot trusts it.

    Raises:
        ConfigError, OSError: the config is bad, untrusted or unreadable.
    """
    from podvm_gpu.config.load import config_location

    path, required = config_location(root, config)
    if not required:
        return MetricsSettings()
    from podvm_gpu.config.load import load_config

    loaded = load_config(path, required=True, trusted=True)
    settings = loaded.metrics
    settings.reset_pending_warns = loaded.health.reset_pending_warns
    return settings
