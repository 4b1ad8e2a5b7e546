// The widget module's version: equals package.json's and dcnb/_src/version.py's (tests/unit/test_widget.py checks).
export const MODULE_NAME = 'dcnb';
export const MODULE_VERSION = '0.1.0';
