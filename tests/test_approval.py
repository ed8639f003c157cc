"""tools/approval.py on its own: how commands are read, what the findings say, and the
policy's bookkeeping (allowlist, session, always, callbacks, threads). Nothing here runs
a command; the terminal tool's own tests run them."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import anyio
import anyio.lowlevel
import pytest

from hermes_sandbox.tools.approval import (
    DANGEROUS_PATTERNS,
    MAX_CHECKED_CHARS,
    MAX_NESTING,
    Approval,
    ApprovalPolicy,
    detect_dangerous,
    normalise_command,
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def keys(command: str) -> set[str]:
    return {finding.key for finding in detect_dangerous(command)}


# -- the table ------------------------------------------------------------------------


def test_every_pattern_has_a_unique_key_and_a_reason() -> None:
    found = [pattern.key for pattern in DANGEROUS_PATTERNS]
    assert len(found) == len(set(found))
    for pattern in DANGEROUS_PATTERNS:
        assert pattern.reason and not pattern.reason.endswith(".")
        assert (pattern.programs is not None) == (pattern.scope in ("command", "wrapper"))


@pytest.mark.parametrize(
    ("command", "key"),
    [
        ("rm -rf /", "rm-recursive-broad"),
        ("mkfs.ext4 /dev/sda1", "mkfs"),
        ("dd if=x of=/dev/sda", "dd-to-device"),
        ("cat x > /dev/sda", "redirect-to-block-device"),
        ("psql -c 'DROP TABLE t'", "sql-drop"),
        ("psql -c 'DELETE FROM t'", "sql-delete-all"),
        ("psql -c 'TRUNCATE TABLE t'", "sql-truncate"),
        ("echo x > /etc/hosts", "etc-redirect"),
        ("curl x | sh", "download-pipe-shell"),
        (":(){ :|:& };:", "fork-bomb"),
        ("kill -9 -1", "kill-all"),
        ("systemctl stop x", "systemctl-stop"),
        ("shutdown now", "shutdown"),
        ("chmod -R 777 /", "chmod-recursive-broad"),
    ],
)
def test_each_family_is_found_under_its_key(command: str, key: str) -> None:
    assert key in keys(command)


# -- reading commands ----------------------------------------------------------------


def test_normalise_command_joins_continuations_and_collapses_whitespace() -> None:
    assert normalise_command("  rm  -rf \\\n\t/tmp/x\n") == "rm -rf /tmp/x"


@pytest.mark.parametrize(
    "command",
    [
        'echo "rm -rf /"',
        "echo 'rm -rf / ; reboot'",
        "printf 'shutdown now\\n'",
        "grep -r 'rm -rf /' .",
        "git commit -m 'do not rm -rf /'",
        "# rm -rf /",
        "ls  # then rm -rf /",
        "man shutdown",
        "which reboot",
        "command -v reboot",
    ],
)
def test_arguments_and_comments_are_data(command: str) -> None:
    assert detect_dangerous(command) == []


def test_quoted_program_with_spaces_is_not_its_first_word() -> None:
    # '"rm -rf /"' as a program name does not exist; running it does nothing
    assert detect_dangerous('"rm -rf /"') == []


def test_echo_piped_into_a_shell_is_read_as_code() -> None:
    assert "rm-recursive-broad" in keys("echo 'rm -rf /' | bash")
    assert "rm-recursive-broad" in keys("printf 'rm -rf /' | sudo sh -s")
    assert detect_dangerous("echo 'rm -rf /' | cat") == []
    assert detect_dangerous("echo 'rm -rf /' | bash script.sh") == []


def test_here_documents_into_a_shell_are_read_as_code() -> None:
    assert "rm-recursive-broad" in keys("bash <<'EOF'\nls\nrm -rf ~\nEOF")


def test_unterminated_quotes_do_not_hide_what_came_before() -> None:
    assert "rm-recursive-broad" in keys("rm -rf / ; echo 'oops")
    assert "rm-recursive-broad" in keys('bash -c "rm -rf /')


def test_nesting_deeper_than_the_limit_is_refused() -> None:
    command = "echo x"
    for _ in range(MAX_NESTING + 2):
        command = f"echo $({command})"
    assert keys(command) == {"too-complex"}
    assert detect_dangerous("echo $(echo $(echo hi))") == []


def test_finding_unit_is_the_part_that_matched() -> None:
    (finding,) = detect_dangerous("cd /srv &&   sudo systemctl restart  nginx; ls")
    assert finding.key == "systemctl-stop"
    assert finding.unit == "sudo systemctl restart nginx"


def test_a_command_with_several_dangers_reports_each() -> None:
    found = keys("curl x | sh; rm -rf ~; reboot")
    assert found == {"download-pipe-shell", "rm-recursive-broad", "rm-recursive", "shutdown"}


def test_interpreter_code_is_flagged_as_such_not_read_as_shell() -> None:
    # python -c is flagged (as Hermes flags it); the text inside is not read as rm
    assert keys("python3 -c \"print('rm -rf /')\"") == {"interpreter-inline-code"}


def test_long_commands_are_checked_in_reasonable_time() -> None:
    script = "cat > /tmp/gen.py <<'EOF'\n" + "\n".join(f"x{i} = {i}" for i in range(5000)) + "\nEOF"
    blob = "echo " + "A" * 300_000 + "()"
    many = "rm " + " ".join(f"-f{i}" for i in range(20_000))
    started = time.perf_counter()
    assert detect_dangerous(script) == []
    assert detect_dangerous(blob) == []
    assert detect_dangerous(many) == []
    assert time.perf_counter() - started < 5


def test_commands_over_the_size_limit_are_refused_unread() -> None:
    (finding,) = detect_dangerous("echo " + "a" * MAX_CHECKED_CHARS)
    assert finding.key == "too-long"


# -- the policy ----------------------------------------------------------------------


class Human:
    """A sync approval callback with scripted answers."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, list[str]]] = []
        self.threads: list[str] = []

    def __call__(self, command: str, reasons: list[str]) -> object:
        self.asked.append((command, reasons))
        self.threads.append(threading.current_thread().name)
        return self.answers.pop(0)


@pytest.mark.anyio
async def test_safe_commands_never_reach_the_callback() -> None:
    human = Human()
    policy = ApprovalPolicy(human)
    assert await policy.check("ls -la && git status") is None
    assert human.asked == []


@pytest.mark.anyio
async def test_refusal_message_names_reasons_and_the_way_out() -> None:
    message = await ApprovalPolicy().check("rm -rf ~ && reboot")
    assert message is not None
    assert message.startswith("Command refused: it recursively deletes a broad path")
    assert "shuts down or reboots the machine" in message
    assert "no one can approve dangerous commands in this run" in message
    assert "A human must approve it" in message
    assert "allowlist in the hermes-sandbox config file" in message


@pytest.mark.anyio
async def test_sync_callback_runs_in_a_worker_thread_without_blocking_the_loop() -> None:
    release = threading.Event()

    def slow_human(command: str, reasons: list[str]) -> str:
        if not release.wait(5):
            return "deny"
        return "once"

    policy = ApprovalPolicy(slow_human)
    results: list[str | None] = []

    async def check() -> None:
        results.append(await policy.check("reboot"))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(check)
        await anyio.sleep(0.05)  # the loop is free while the human thinks
        release.set()
    assert results == [None]


@pytest.mark.anyio
async def test_cancelling_a_check_does_not_wait_for_the_human() -> None:
    release = threading.Event()

    def absent_human(command: str, reasons: list[str]) -> str:
        release.wait(10)
        return "deny"

    policy = ApprovalPolicy(absent_human)
    try:
        with anyio.move_on_after(0.2) as scope:
            await policy.check("reboot")
        assert scope.cancelled_caught
    finally:
        release.set()


@pytest.mark.anyio
async def test_answers_are_accepted_as_enum_and_loose_strings() -> None:
    human = Human(Approval.SESSION, " ONCE ", "Deny")
    policy = ApprovalPolicy(human)
    assert await policy.check("reboot") is None
    assert await policy.check("reboot") is None  # session
    assert await policy.check("halt") is None
    refused = await policy.check("poweroff")
    assert refused is not None and "the human denied it" in refused
    assert len(human.asked) == 3


@pytest.mark.anyio
async def test_session_approval_covers_exactly_that_command() -> None:
    human = Human("session", "deny", "deny")
    policy = ApprovalPolicy(human)
    assert await policy.check("systemctl restart nginx") is None
    assert policy.session_approvals == {("systemctl-stop", "systemctl restart nginx")}
    assert await policy.check("systemctl   restart nginx") is None  # same once normalised
    assert await policy.check("systemctl restart postgres") is not None
    # the approved command chained with another danger still needs approval
    assert await policy.check("systemctl restart nginx; reboot") is not None
    assert len(human.asked) == 3


@pytest.mark.anyio
async def test_always_persists_through_sync_and_async_on_always() -> None:
    saved: list[str] = []

    async def save(entry: str) -> None:
        await anyio.lowlevel.checkpoint()
        saved.append(entry)

    policy = ApprovalPolicy(Human("always"), on_always=save)
    assert await policy.check("sudo   reboot") is None
    assert saved == ["sudo reboot"]
    assert policy.permanent_allowlist == ["sudo reboot"]
    assert await policy.check("sudo reboot") is None

    def broken_save(entry: str) -> None:
        raise OSError("config is read-only")

    policy = ApprovalPolicy(Human("always"), on_always=broken_save)
    assert await policy.check("halt") is None  # approval stands; the failure is logged
    assert policy.permanent_allowlist == ["halt"]


@pytest.mark.anyio
async def test_always_never_turns_a_command_into_a_regex() -> None:
    saved: list[str] = []
    policy = ApprovalPolicy(Human("always"), on_always=saved.append)
    assert await policy.check("re:.*|reboot") is None  # as shell: "re:.*" piped into reboot
    assert saved == [r"re:re:\.\*\|reboot"]
    assert await policy.check("re:.*|reboot") is None
    assert await policy.check("rm -rf /") is not None
    reloaded = ApprovalPolicy(allowlist=saved)
    assert await reloaded.check("rm -rf /") is not None


def test_allowlist_entries_are_validated() -> None:
    with pytest.raises(ValueError, match="not a valid regex"):
        ApprovalPolicy(allowlist=["re:rm -rf (unclosed"])
    with pytest.raises(ValueError, match="non-empty"):
        ApprovalPolicy(allowlist=["  "])
    policy = ApprovalPolicy(allowlist=["reboot", "  reboot ", "re:halt|poweroff"])
    assert policy.permanent_allowlist == ["reboot", "re:halt|poweroff"]


@pytest.mark.anyio
async def test_allowlist_exact_entries_match_whole_command_or_flagged_part() -> None:
    policy = ApprovalPolicy(allowlist=["systemctl restart nginx", "rm -rf ~/a && reboot"])
    assert await policy.check("systemctl restart nginx") is None
    assert await policy.check("cd /srv && systemctl restart nginx") is None
    assert await policy.check("sudo systemctl restart nginx") is not None  # sudo is part of it
    assert await policy.check("rm -rf ~/a &&  reboot") is None  # the whole command
    assert await policy.check("reboot") is not None


@pytest.mark.anyio
async def test_allowlist_regexes_match_flagged_parts_in_full_only() -> None:
    policy = ApprovalPolicy(allowlist=[r"re:(sudo )?systemctl restart (nginx|redis)"])
    assert await policy.check("sudo systemctl restart redis") is None
    assert await policy.check("systemctl restart nginx && ls") is None
    assert await policy.check("systemctl restart nginx-old") is not None
    assert await policy.check("systemctl restart nginx; systemctl stop sshd") is not None
    greedy = ApprovalPolicy(allowlist=[r"re:rm -rf /tmp/.*"])
    assert await greedy.check("rm -rf /tmp/*") is None
    assert await greedy.check("rm -rf /tmp/x; rm -rf /") is not None


def test_policy_is_safe_to_share_between_threads() -> None:
    calls = 0
    lock = threading.Lock()

    def human(command: str, reasons: list[str]) -> str:
        nonlocal calls
        with lock:
            calls += 1
        return "session"

    policy = ApprovalPolicy(human)
    commands = [f"systemctl restart unit{i % 10}" for i in range(200)]

    def check(command: str) -> str | None:
        return anyio.run(policy.check, command)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(check, commands))
    assert results == [None] * 200
    assert {command for _, command in policy.session_approvals} == set(commands)
    assert 10 <= calls <= 200  # concurrent first checks of one command may each ask


# -- attacks: forms that used to slip past the table (issue #11) ---------------------


@pytest.mark.parametrize(
    ("command", "key"),
    [
        # GNU getopt takes any unambiguous prefix of a long option
        ("rm --recur /", "rm-recursive-broad"),
        ("rm --recursive --force /", "rm-recursive-broad"),
        ("rm --r --f ~", "rm-recursive-broad"),
        ("rm -r --no-pres /", "rm-no-preserve-root"),
        ("chmod --recurs 777 /", "chmod-recursive-broad"),
        ("chown --rec nobody ~", "chmod-recursive-broad"),
        ("sed --in 's/a/b/' /etc/hosts", "etc-edit-in-place"),
        ("timeout --sig KILL 5 rm -rf /", "rm-recursive-broad"),
        ("sudo --us root rm -rf /", "rm-recursive-broad"),
        # ${IFS} word splitting
        ("rm${IFS}-rf${IFS}/", "rm-recursive-broad"),
        ("rm$IFS-rf$IFS/", "rm-recursive-broad"),
        ("rm${IFS%?}-rf${IFS:0:1}~", "rm-recursive-broad"),
        ("sh -c 'rm${IFS}-rf${IFS}/'", "rm-recursive-broad"),
        # brace expansion
        ("{rm,-rf,/}", "rm-recursive-broad"),
        ("{rm,-rf,~}", "rm-recursive-broad"),
        ("rm {-rf,/}", "rm-recursive-broad"),
        ("{reboot,now}", "shutdown"),
        # wrappers, each with its own options
        ("flock /tmp/lock rm -rf /", "rm-recursive-broad"),
        ("flock -w 5 /tmp/lock rm -rf /", "rm-recursive-broad"),
        ("flock /tmp/lock -c 'rm -rf /'", "rm-recursive-broad"),
        ("flock --timeout 5 -x /tmp/lock --command 'rm -rf ~'", "rm-recursive-broad"),
        ("strace rm -rf /", "rm-recursive-broad"),
        ("strace -f -o /tmp/log rm -rf /", "rm-recursive-broad"),
        ("strace -fo /tmp/log -e trace=file rm -rf /", "rm-recursive-broad"),
        ("unshare rm -rf /", "rm-recursive-broad"),
        ("unshare -r -m --propagation private -w / rm -rf /", "rm-recursive-broad"),
        ("setpriv --reuid 0 --regid 0 --clear-groups rm -rf /", "rm-recursive-broad"),
        ("setpriv --nnp reboot", "shutdown"),
        ("script -c 'rm -rf /' /dev/null", "rm-recursive-broad"),
        ("script -q /dev/null -c 'rm -rf /'", "rm-recursive-broad"),
        ("script -qc 'rm -rf ~' /dev/null", "rm-recursive-broad"),
        ("script --command='rm -rf /'", "rm-recursive-broad"),
        ("parallel rm -rf ::: /", "rm-recursive-broad"),
        ("parallel -j 4 'rm -rf {}' ::: /tmp/a /", "rm-recursive-broad"),
        ("parallel ::: 'rm -rf /' 'ls'", "rm-recursive-broad"),
        ("parallel --jobs 2 rm -rf ::: ~", "rm-recursive-broad"),
        ("systemd-run rm -rf /", "rm-recursive-broad"),
        ("systemd-run --user --unit x -p Nice=5 --wait rm -rf /", "rm-recursive-broad"),
        ("chrt 0 rm -rf /", "rm-recursive-broad"),
        ("chrt -f 10 rm -rf /", "rm-recursive-broad"),
        ("chrt --rr -T 100 10 reboot", "shutdown"),
        ("sudo flock /tmp/l strace -f unshare -r chrt 0 rm -rf /", "rm-recursive-broad"),
        ("ltrace -f -o /tmp/log rm -rf /", "rm-recursive-broad"),
        ("nsenter -t 1 -m -u -n rm -rf /", "rm-recursive-broad"),
        ("prlimit --nofile=10 rm -rf /", "rm-recursive-broad"),
        ("setarch x86_64 -R rm -rf /", "rm-recursive-broad"),
        ("fakeroot -- rm -rf /", "rm-recursive-broad"),
    ],
)
def test_evasive_forms_are_flagged(command: str, key: str) -> None:
    assert key in keys(command)


@pytest.mark.parametrize(
    "command",
    [
        "rm --verbose build/x",  # a long option that is not --recursive
        "chmod --ref=a.txt b.txt",
        "echo {a,b}",
        "echo ${HOME}",
        "find . -name x -exec echo {} ;",
        "flock /tmp/lock ls",
        "flock -n 9",  # no command: locks a file descriptor
        "strace -p 1234",  # attaches; runs nothing
        "chrt -p 1234",
        "chrt -m",
        "script /dev/null",
        "parallel echo ::: a b",
        "unshare -r id",
        "systemd-run --user sleep 1",
    ],
)
def test_wrapped_and_expanded_safe_commands_pass(command: str) -> None:
    assert detect_dangerous(command) == []


def test_brace_expansion_is_bounded() -> None:
    started = time.perf_counter()
    assert detect_dangerous("echo " + "{a,b}" * 40) == []
    assert detect_dangerous("echo " + "{" * 5000 + "a,b" + "}" * 5000) == []
    assert time.perf_counter() - started < 5


@pytest.mark.anyio
@pytest.mark.parametrize(
    "command",
    [
        "rm -rf /tmp/x /",  # a second operand the regex's .* swallowed
        "rm -rf /tmp/../",  # .. resolved: this is rm -rf /
        "rm -rf /tmp/x/../../",
        "rm -rf /tmp/x $HOME",  # an unexpanded variable
        "rm -rf /tmp/* /tmp/$X",
        'rm -rf /tmp/* "/tmp/$(echo ..)"',
        "rm -rf /tmp/* etc",  # a bare relative operand
        "rm -rf /tmp/* -- /",
        "rm -rf /tmp/* ~",
        "rm${IFS}-rf${IFS}/tmp/x${IFS}/",
        "{rm,-rf,/tmp/x,/}",
        "sudo rm -rf /tmp/x /",
    ],
)
async def test_allowlist_regex_does_not_stretch_over_other_operands(command: str) -> None:
    policy = ApprovalPolicy(allowlist=[r"re:(sudo )?rm -rf /tmp/.*"])
    assert await policy.check(command) is not None


@pytest.mark.anyio
async def test_allowlist_regex_matches_each_normalised_operand() -> None:
    policy = ApprovalPolicy(allowlist=[r"re:rm -rf /tmp/.*", r"re:chmod -R 777 /srv/(a|b)/.*"])
    assert await policy.check("rm -rf /tmp/*") is None
    assert await policy.check("rm  -rf '/tmp/*'") is None  # quotes removed
    assert await policy.check("rm -rf /tmp/* /tmp/y/../z") is None  # each operand fits
    assert await policy.check("rm -rf /tmp/* && rm -rf /tmp/x/../*") is None
    assert await policy.check("chmod -R 777 /srv/a/* /srv/b/..//b/*") is None
    assert await policy.check("chmod -R 777 /srv/a/* /srv/c/..") is not None  # /srv
    assert await policy.check("chmod -R 777 /srv/a/* /") is not None
    # several entries may share the operands out
    both = ApprovalPolicy(allowlist=[r"re:rm -rf /tmp/.*", r"re:rm -rf /var/tmp/.*"])
    assert await both.check("rm -rf /tmp/* /var/tmp/*") is None
    assert await both.check("rm -rf /tmp/* /var/*") is not None


@pytest.mark.anyio
async def test_allowlist_regex_never_allows_what_the_text_does_not_show() -> None:
    policy = ApprovalPolicy(allowlist=[r"re:.*"])
    assert await policy.check("rm -rf $HOME") is not None
    assert await policy.check("rm -rf `pwd`/..") is not None
    assert await policy.check("reboot") is None
    exact = ApprovalPolicy(allowlist=["rm -rf $HOME"])  # an exact entry still can
    assert await exact.check("rm  -rf $HOME") is None


@pytest.mark.anyio
async def test_allowlist_regex_for_a_redirect_matches_each_target() -> None:
    policy = ApprovalPolicy(allowlist=[r"re:echo .* > /etc/motd"])
    assert await policy.check("echo hello > /etc/motd") is None
    assert await policy.check("echo hello > /etc/x/../motd") is None
    assert await policy.check("echo hello > /etc/motd > /etc/shadow") is not None
    assert await policy.check("echo hello > /etc/../etc/shadow") is not None
