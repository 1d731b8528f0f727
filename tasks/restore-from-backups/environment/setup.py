import io, os, tarfile
B = "/app/backups"
os.makedirs(B, exist_ok=True)
def tar(name, files):
    with tarfile.open(os.path.join(B, name), "w:gz") as t:
        for path, data in files.items():
            data = data.encode()
            ti = tarfile.TarInfo("project/" + path); ti.size = len(data); ti.mtime = 1704067200
            t.addfile(ti, io.BytesIO(data))
full = {
    "README.md": "# Project\nversion 1\n",
    "src/main.py": "print('v1')\n",
    "src/util.py": "def helper():\n    return 1\n",
    "src/legacy.py": "# old code\n",
    "config/app.yaml": "debug: true\nport: 8000\n",
    "docs/guide.md": "guide v1\n",
    "data/seed.csv": "id,name\n1,a\n",
}
tar("full-20240101.tar.gz", full)
tar("incr-20240102.tar.gz", {"src/main.py": "print('v2')\n", "src/api.py": "API = 2\n", "docs/changelog.md": "- day 2\n"})
open(f"{B}/deleted-20240102.txt", "w").write("src/legacy.py\n")
tar("incr-20240103.tar.gz", {"config/app.yaml": "debug: false\nport: 8080\n", "docs/changelog.md": "- day 2\n- day 3\n", "tmp/cache.bin": "cache\n"})
open(f"{B}/deleted-20240103.txt", "w").write("tmp/cache.bin\ndata/seed.csv\n")
tar("incr-20240104.tar.gz", {"src/main.py": "print('v4 broken')\n", "NEW_IN_DAY4.txt": "no\n"})
open(f"{B}/deleted-20240104.txt", "w").write("README.md\n")
open(f"{B}/README.backup", "w").write(
    "Every archive stores paths under a leading 'project/' directory, e.g. project/src/main.py.\n"
    "Strip that prefix when restoring. Paths in deleted-*.txt have no prefix.\n")
