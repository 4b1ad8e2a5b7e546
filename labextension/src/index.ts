// One plugin: registers the 'dcnb' widget module (SessionModel, SessionView) with Jupyter widgets, and the
// renderer of dcnb's output (the live widget, or its static rendering without the kernel).
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { IJupyterWidgetRegistry } from '@jupyter-widgets/base';

import { RANK, SESSION_MIME, SessionRenderer } from './renderer';
import { SessionModel, SessionView } from './widget';
import { MODULE_NAME, MODULE_VERSION } from './version';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'dcnb:plugin',
  description: 'The dcnb session widget: SDFG views, actions and results.',
  requires: [IJupyterWidgetRegistry, IRenderMimeRegistry],
  autoStart: true,
  activate: (app: JupyterFrontEnd, registry: IJupyterWidgetRegistry, rendermime: IRenderMimeRegistry) => {
    registry.registerWidget({ name: MODULE_NAME, version: MODULE_VERSION, exports: { SessionModel, SessionView } });
    // notebooks clone this registry, so every notebook gets the renderer too
    rendermime.addFactory(
      { safe: true, mimeTypes: [SESSION_MIME], createRenderer: () => new SessionRenderer(rendermime) },
      RANK
    );
  }
};

export default plugin;
