"""The hadoop CLI handler's metadata cache: what a command read is cached only if no change of this
handler happened while it ran (storage/hadoop_cli_cache.MetadataCache)."""

from pyarrow.fs import FileInfo, FileType

from paddle_acp.storage.hadoop_cli_cache import MetadataCache


def test_a_listing_begun_before_a_mkdir_does_not_replace_what_the_mkdir_recorded():
    """Rank 0 lists writers/ while another thread of the same handler makes writers/rank-1: the listing
    (read before the mkdir returned) must not be cached over the mkdir's record (it was, and the directory
    then read as missing for the cache's lifetime)."""
    c = MetadataCache(60.0)
    c._note("/j/writers", FileInfo("/j/writers", FileType.Directory))
    token = c._token()  # the listing command starts
    c._note("/j/writers/rank-1", FileInfo("/j/writers/rank-1", FileType.Directory))  # the mkdir returns
    c._store_listing("/j/writers", {}, token)  # the listing's (older) answer arrives
    info = c._cached_info("/j/writers/rank-1")
    assert info is not None and info.type == FileType.Directory
    fresh = c._token()
    c._store_listing("/j/writers", {"rank-1": FileInfo("/j/writers/rank-1", FileType.Directory)}, fresh)
    assert c._cached_listing("/j/writers") is not None  # nothing changed meanwhile: cached


def test_a_missing_path_seen_before_it_was_made_is_not_cached_as_missing():
    c = MetadataCache(60.0)
    token = c._token()  # `-ls /j/x` starts and will fail: not there yet
    c._note("/j/x", FileInfo("/j/x", FileType.Directory))  # made by this handler meanwhile
    c._note("/j/x", FileInfo("/j/x", FileType.NotFound), token)  # the failed listing's observation
    info = c._cached_info("/j/x")
    assert info is not None and info.type == FileType.Directory
    c._note("/j/y", FileInfo("/j/y", FileType.NotFound), c._token())  # no change meanwhile: recorded
    info = c._cached_info("/j/y")
    assert info is not None and info.type == FileType.NotFound
