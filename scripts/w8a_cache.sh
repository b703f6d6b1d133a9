# Sourced by the reproduction scripts, after `make -s setup`, from the repository's root: where
# w8a is not in hetsgd's data cache but a local copy is ($HETSGD_W8A, scripts/w8a_path.py), the
# runs read it through a data cache of their own (HETSGD_DATA, a temporary folder removed at
# exit; a script that sets its own EXIT trap removes "$W8A_LINKED" in it). Otherwise nothing
# changes, and a run that needs w8a says where to put it.
if ! .venv/bin/python -c "import sys; from hetsgd.data import source_info
sys.exit(not source_info('w8a').cached)"; then
  w8a=$(.venv/bin/python scripts/w8a_path.py)
  if [[ -f $w8a ]]; then
    W8A_LINKED=$(mktemp -d)
    HETSGD_DATA=$W8A_LINKED
    export HETSGD_DATA
    trap 'rm -rf "$W8A_LINKED"' EXIT
    ln -s "$w8a" "$HETSGD_DATA/$(.venv/bin/python scripts/w8a_path.py --name)"
  fi
fi
