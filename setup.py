"Packaging for rlhf-nb: everything is read from settings.ini (nbdev 2 layout)."
from configparser import ConfigParser
import setuptools, shlex, shutil
from pathlib import Path
from setuptools.command.build_py import build_py

config = ConfigParser(delimiters=['='])
config.read('settings.ini', encoding='utf-8')
cfg = config['DEFAULT']

expected = 'version description keywords author author_email license lib_name user min_python'.split()
missing = [o for o in expected if o not in cfg]
if missing: raise SystemExit(f"settings.ini is missing: {', '.join(missing)}")

licenses = {'apache2': ('Apache Software License 2.0', 'OSI Approved :: Apache Software License')}
statuses = ['1 - Planning', '2 - Pre-Alpha', '3 - Alpha', '4 - Beta', '5 - Production/Stable', '6 - Mature', '7 - Inactive']
py_versions = '3.10 3.11 3.12 3.13'.split()

requirements = shlex.split(cfg.get('requirements', ''))
dev_requirements = shlex.split(cfg.get('dev_requirements', ''))
# optional extras, one per integration: pip install 'rlhf-nb[ray]', 'rlhf-nb[wandb]' (settings.ini: NAME_requirements = ...)
extras = {k[:-len('_requirements')]: shlex.split(v) for k, v in cfg.items()
          if k.endswith('_requirements') and k not in ('requirements', 'dev_requirements')}
lic = licenses[cfg['license'].lower()]
min_python = cfg['min_python']
lib_path = cfg['lib_path']
scripts = [o.strip() for o in cfg.get('console_scripts', '').split('\n') if o.strip()]



class build_py_with_configs(build_py):
    "Ship the repository's configs/ (run presets, accelerate configs) inside the package as rlhf_nb/configs/."
    def run(self):
        super().run()
        src = Path(__file__).resolve().parent / 'configs'
        for f in sorted(src.rglob('*.yaml')):
            dst = Path(self.build_lib) / lib_path / 'configs' / f.relative_to(src)
            dst.parent.mkdir(parents=True, exist_ok=True); shutil.copyfile(f, dst)


setuptools.setup(
    cmdclass={'build_py': build_py_with_configs},
    name=cfg['lib_name'],
    license=lic[0],
    classifiers=['Development Status :: ' + statuses[int(cfg['status'])],
                 'Intended Audience :: ' + cfg['audience'].title(),
                 'License :: ' + lic[1],
                 'Natural Language :: ' + cfg['language'].title()] +
                ['Programming Language :: Python :: ' + o for o in py_versions[py_versions.index(min_python):]],
    url=cfg['git_url'],
    packages=setuptools.find_packages(include=[lib_path, lib_path + '.*']),
    include_package_data=True,
    install_requires=requirements,
    extras_require={'dev': dev_requirements, **extras},
    dependency_links=cfg.get('dep_links', '').split(),
    python_requires='>=' + min_python,
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    zip_safe=False,
    entry_points={'console_scripts': scripts, 'nbdev': [f'{cfg["lib_path"]}={cfg["lib_path"]}._modidx:d']},
    version=cfg['version'], description=cfg['description'], keywords=cfg['keywords'],
    author=cfg['author'], author_email=cfg['author_email'],
)
