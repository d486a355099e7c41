from __future__ import annotations

import shlex

from supervisor.datatypes import RestartUnconditionally
from supervisor.options import ServerOptions

from sessionize_assets.deployment.supervisor import Program, supervisor_conf


def test_supervisor_reads_back_each_program_as_written(tmp_path):
    """supervisord's own parser: every word of a command comes back whole (spaces, quotes,
    its `%` interpolation), with its priority, stop signal, account and folder."""
    (tmp_path / "logs").mkdir()
    programs = [
        Program(
            name="postgres",
            command=["/bin/pg", "-c", "unix_socket_directories="],
            priority=10,
            stop_signal="INT",
            user="root",
        ),
        Program(name="daemon", command=["/bin/run", "50%", "two words", 'a"quote'], priority=40),
    ]
    conf = tmp_path / "supervisord.conf"
    conf.write_text(supervisor_conf(programs=programs, folder=tmp_path, working_dir=tmp_path))
    options = ServerOptions()
    options.configfile = str(conf)
    options.process_config(do_usage=False)
    read = {
        process.name: process
        for group in options.process_group_configs
        for process in group.process_configs
    }
    assert set(read) == {"postgres", "daemon"}
    for program in programs:
        process = read[program.name]
        assert shlex.split(process.command) == list(program.command)
        assert process.priority == program.priority
        assert process.directory == str(tmp_path)
        assert process.autorestart is RestartUnconditionally
        assert process.stopasgroup and process.killasgroup
        assert process.stdout_logfile == str(tmp_path / "logs" / f"{program.name}.log")
    assert read["postgres"].stopsignal == 2 and read["postgres"].uid == 0  # SIGINT, root
    assert read["daemon"].stopsignal == 15 and read["daemon"].uid is None
    (control,) = options.configroot.supervisord.server_configs
    assert control["file"] == str(tmp_path / "supervisor.sock") and control["chmod"] == 0o700
