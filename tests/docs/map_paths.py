#!/usr/bin/env python3
"""Every path that docs/design.md (the map of folders) names must exist in the tree.

A name in backticks counts when it looks like a path: a folder of the repository followed by more
(`runtime/src/tensor.cpp`, `actors/`), an include path (`troupe/...`, looked for under every
`*/include/`), or a bare source file name (`server.cpp`, looked for anywhere in the tree). Build
outputs (`build/...`) and globs are not checked. Exits 1 naming each missing path."""
import os
import re
import sys

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..', '..'))
docs = sys.argv[2:] or ['docs/design.md']
SOURCE = re.compile(r'^[\w.-]+\.(cpp|hpp|h|cu|py|sh|cmake|capnp|proto|html|js|md)$')

tops = {d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and not d.startswith('.')} - {'build'}
names = set()
for dp, dns, fns in os.walk(root):
    dns[:] = [d for d in dns if not d.startswith('.') and d != 'build' and not d.startswith('build-')]
    names.update(fns)
include_roots = [os.path.join(root, t, 'include') for t in tops if os.path.isdir(os.path.join(root, t, 'include'))]

def exists(token):
    token = token.rstrip('/')
    first = token.split('/')[0]
    if first in tops:
        return os.path.exists(os.path.join(root, token))
    if first == 'troupe':
        return any(os.path.exists(os.path.join(r, token)) for r in include_roots)
    return True  # not a repository path

missing, checked = [], 0
for doc in docs:
    text = open(os.path.join(root, doc), encoding='utf-8').read()
    for lineno, line in enumerate(text.split('\n'), 1):
        for token in re.findall(r'`([^`\s]+)`', line):
            token = token.split('(')[0].split('::')[0].rstrip('.,;:')
            if '*' in token or token.startswith(('build/', 'http', '-', '$')):
                continue
            if '/' in token:
                if token.split('/')[0] in tops or token.startswith('troupe/'):
                    checked += 1
                    if not exists(token):
                        missing.append('%s:%d: %s' % (doc, lineno, token))
            elif SOURCE.match(token):
                checked += 1
                if token not in names:
                    missing.append('%s:%d: %s (no file of that name in the tree)' % (doc, lineno, token))

for m in missing:
    print('missing: ' + m)
print('%d paths checked, %d missing' % (checked, len(missing)))
sys.exit(1 if missing or checked == 0 else 0)
