"""Names vulture reports as unused that are alive: read by something vulture does not see.

The dead-code check (tests/integration/test_dead_code.py, issue 43) runs
``vulture paddle_acp paddle_acp_cli.py ci/vulture_allow.py --min-confidence 60``; a name used here
counts as used. Never run; each entry says who uses the name. Keep it short: a name that only a
test reads is dead unless the test reads it off a real path (then say which test).
"""

from paddle_acp import __dir__, __getattr__  # PEP 562 module hooks: Python calls them
from paddle_acp.compat import acp_checker, acp_status, auto_checkpoint, checkpoint_saver
from paddle_acp.format.engine.arena import Arena
from paddle_acp.format.metrics_record import MetricsRecord
from paddle_acp.runtime import hook
from paddle_acp.runtime.agree import Agreement
from paddle_acp.runtime.values import Counter
from paddle_acp.storage.hadoop_cli import HadoopCliHandler
from paddle_acp.storage.hadoop_cli_io import StagedOutput
from paddle_acp.storage.local import LocalInput
from paddle_acp.tools.stats import StatsResult

_ = [  # (vulture ignores the name _)
    __getattr__, __dir__,
    # Paddle's own names (the compat layer is a drop-in for paddle.base.incubate.checkpoint): Paddle's
    # Executor.run, fleet and scripts written for Paddle's API call or read them
    auto_checkpoint.g_acp_type, auto_checkpoint.g_program_attr, auto_checkpoint._get_logger,
    auto_checkpoint._thread_checker, auto_checkpoint._get_checker, auto_checkpoint._can_auto_checkpoint,
    auto_checkpoint._auto_checkpoint, auto_checkpoint._get_valid_program, auto_checkpoint._get_running_key,
    auto_checkpoint._normal_yield,
    acp_checker.AutoCheckpointChecker._fs_cache, acp_checker.AutoCheckpointChecker.get_range_checkpoint_path,
    acp_checker.AutoCheckpointChecker.get_exe_checkpoint_path,
    checkpoint_saver.PaddleModel._origin_program, checkpoint_saver.CheckpointSaver.save_checkpoint,
    checkpoint_saver.CheckpointSaver.load_checkpoint, checkpoint_saver.CheckpointSaver.clean_redundant_checkpoints,
    # ExeTrainStatus's fields, read by name (acp_status._FIELDS: Paddle's JSON record and equality)
    acp_status.ExeTrainStatus._hash_key, acp_status.ExeTrainStatus._checkpoint_no,
    acp_status.ExeTrainStatus._restored_from, acp_status.ExeTrainStatus._exe_name,
    acp_status.ExeTrainStatus._program_name,
    # pyarrow.fs.FileSystemHandler's methods and a raw file's: pyarrow calls them
    HadoopCliHandler.get_type_name, HadoopCliHandler.equals, HadoopCliHandler.delete_dir_contents,
    HadoopCliHandler.delete_root_dir_contents, HadoopCliHandler.copy_file, HadoopCliHandler.open_input_stream,
    StagedOutput.writable, StagedOutput.seekable, StagedOutput.tell,
    LocalInput.read_at,  # open_input's random-access read, as pyarrow's (test_storage_contract reads it off open_input)
    HadoopCliHandler.commands_run,  # ci/bench/storage_backends.py counts the hadoop commands a save and a restore run
    MetricsRecord.throughput_mb_s,  # a field of the metrics line (dataclasses.fields): paddle-acp stats reads it
    Counter.increment,  # public API of acp.Counter (docs/guide.md)
    hook.install.__paddle_acp_original__,  # the mark on the Executor.run patch: Paddle's run (ci/bench/local_costs_figures.py)
    # state that a test reads off the real path
    Arena.populating,  # tests/e2e/test_arena_first_save.py: the first save's arena is populated in the background
    Agreement.disagreements,  # tests/unit/runtime/test_save_plan.py: a rank that read another plan counted it
    StatsResult.plot_legend,  # tests/unit/tools/test_stats.py: the plot's legend names each range
]
